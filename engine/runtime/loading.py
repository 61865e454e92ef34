"""Model names to a ready runtime: the embedded default, GGUF files, HF directories and repo ids, dummy shapes."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import torch

from quail.engine.errors import InvalidArgument, NotFound
from quail.engine.kernels.fp8 import to_fp8
from quail.engine.kv.host_tier import default_disk_bytes, default_host_bytes
from quail.engine.kv.pool import RESERVE, default_pool_bytes
from quail.engine.model.config import ATTENTION, EngineConfig, ModelConfig
from quail.engine.model.decoder import Decoder
from quail.engine.model.embedded import embedded_gguf
from quail.engine.model import gguf_cache
from quail.engine.model.hf_weights import (TEMPLATE_FILE, cached_snapshot, chat_template, download, is_model_directory,
                                           load_directory)
from quail.engine.model.tokenizer import Tokenizer
from quail.engine.runtime.decoder_embedding import DecoderEmbedding
from quail.engine.runtime.embeddings import Embeddings
from quail.engine.runtime.prompt import ChatFrame
from quail.engine.runtime.runtime import Runtime

DEFAULT_MODEL = "smollm2-135m"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp8": torch.bfloat16}  # precision → activations


def _qwen3(hidden: int, layers: int, heads: int, intermediate: int) -> ModelConfig:
    return ModelConfig(arch="qwen3", vocab_size=151936, hidden_size=hidden, num_layers=layers, num_heads=heads,
                       num_kv_heads=8, head_dim=128, intermediate_size=intermediate, rope_theta=1e6,
                       rms_norm_eps=1e-6, qk_norm=True, tie_embeddings=True, max_position=40960)


DUMMY_SHAPES = {
    "qwen3-0.6b": _qwen3(1024, 28, 16, 3072),
    "qwen3-1.7b": _qwen3(2048, 28, 16, 6144),
    "qwen3-4b": _qwen3(2560, 36, 32, 9728),
    "qwen3-embedding-0.6b": _qwen3(1024, 28, 16, 3072),  # Qwen3-Embedding's shapes are its base models'
    "qwen3-embedding-4b": _qwen3(2560, 36, 32, 9728),
    "smollm2-135m": ModelConfig(arch="llama", vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9,
                                num_kv_heads=3, head_dim=64, intermediate_size=1536, rope_theta=100000.0,
                                rms_norm_eps=1e-5, tie_embeddings=True),
}


def resolve(name: str | None) -> tuple[str, Path]:
    """(model id, weights path) for a model name: the embedded default, a local HF directory or
    GGUF file, or an HF repo id ("org/name") from the local Hugging Face cache (downloaded if allowed)."""
    name = name or DEFAULT_MODEL
    if name in (DEFAULT_MODEL, "default"):
        return "smollm2-135m-instruct-q4_1", embedded_gguf()
    path = Path(name).expanduser()
    if path.is_dir() and is_model_directory(path):
        return path.name, path
    if path.suffix == ".gguf" and path.is_file():
        return path.stem, path
    if name.count("/") == 1 and not path.exists() and not name.startswith((".", "/", "~")):
        return name.replace("/", "--"), cached_snapshot(name) or download(name)
    raise NotFound(f"unknown model {name!r}: give {DEFAULT_MODEL!r}, 'dummy:<shape>' ({', '.join(DUMMY_SHAPES)}), "
                   "an HF model directory, a .gguf file or an HF repo id in the local cache")


def save_tokenizer(directory: str | Path, tokenizer: Tokenizer, template: str | None) -> None:
    """Write an HF tokenizer directory: tokenizer.json and chat_template.jinja."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(directory / "tokenizer.json")
    (directory / TEMPLATE_FILE).write_text(template or "")


def export_embedded_tokenizer(directory: str | Path) -> None:
    """The embedded model's tokenizer and chat template as an HF tokenizer directory (for dummy weights)."""
    vocab, template = gguf_cache.vocab(embedded_gguf())
    save_tokenizer(directory, Tokenizer.from_gguf_vocab(vocab), template)


def _tokenizer_and_frame(directory: str | Path | None) -> tuple[Tokenizer, ChatFrame]:
    if directory is None:
        vocab, template = gguf_cache.vocab(embedded_gguf())
        return Tokenizer.from_gguf_vocab(vocab), ChatFrame.from_template(template)
    path = Path(directory)
    if not (path / "tokenizer.json").is_file():
        raise NotFound(f"no tokenizer.json in {path}")
    return Tokenizer.from_file(path / "tokenizer.json"), ChatFrame.from_template(chat_template(path))


@contextlib.contextmanager
def building_on(device: str | torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Modules constructed inside get their parameters on `device` in `dtype` (no copy afterwards)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(default)


def _dummy(shape: str) -> Decoder:
    if shape not in DUMMY_SHAPES:
        raise NotFound(f"unknown dummy shape {shape!r}; use one of {', '.join(DUMMY_SHAPES)}")
    torch.manual_seed(0)
    model = Decoder(DUMMY_SHAPES[shape])
    for name, param in model.named_parameters():  # as HF initializes: normal(0, 0.02), norms at one
        if not name.endswith("norm.weight"):
            param.data.normal_(0.0, 0.02)
    return model


def _loaded(config: ModelConfig, state_dict: dict[str, torch.Tensor]) -> Decoder:
    with torch.device("meta"):
        model = Decoder(config)
    model.load_state_dict(state_dict, strict=True, assign=True)
    return model


def prepare(model: Decoder, config: EngineConfig) -> Decoder:
    """Weights on the configured device and precision (fp8 linears where asked), layers compiled where asked."""
    model = model.to(device=config.device, dtype=DTYPES[config.precision]).eval().requires_grad_(False)
    if config.precision == "fp8":
        to_fp8(model.layers)
    if config.compiled:
        model.compile_layers()
    model.padded_attention = config.attention_layout == "buckets"
    return model


def _check_device(device: str) -> None:
    """InvalidArgument unless the device names one this torch build can use."""
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise InvalidArgument(f"unknown device {device!r}: use cpu, cuda or cuda:N") from None
    if kind not in ("cpu", "cuda"):
        raise InvalidArgument(f"device {device!r} is not supported: use cpu, cuda or cuda:N")
    if kind == "cuda" and not torch.cuda.is_available():
        raise InvalidArgument(f"device {device!r}: no CUDA GPU is available to this torch build "
                              f"({torch.__version__}): use cpu")
    index = torch.device(device).index
    if kind == "cuda" and index is not None and index >= torch.cuda.device_count():
        raise InvalidArgument(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")


GPU_TOKEN_BUDGET = 16384  # new tokens a forward pass, by default on a GPU
CPU_TOKEN_BUDGET = 1024  # on the CPU: a pass of the embedded model takes about 2 s on two cores (4,096: 9 s, no
# more tokens a second), and a cancel or a time limit stops a query's model work at the end of a pass

def settled(config: EngineConfig) -> EngineConfig:
    """The config with what it left to the machine chosen: device "auto" → cuda when a CUDA GPU is present,
    else cpu; precision "auto" → bf16 on a GPU, fp32 on the CPU; token budget None → GPU_TOKEN_BUDGET on a
    GPU, CPU_TOKEN_BUDGET on the CPU; replicas None → one per CUDA GPU present (InvalidArgument for a device
    this machine lacks)."""
    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    _check_device(device)
    gpu = torch.device(device).type == "cuda"
    precision = ("bf16" if gpu else "fp32") if config.precision == "auto" else config.precision
    budget = config.token_budget if config.token_budget is not None else GPU_TOKEN_BUDGET if gpu else CPU_TOKEN_BUDGET
    replicas = config.replicas if config.replicas is not None else torch.cuda.device_count() if gpu else 1
    return replace(config, device=device, precision=precision, token_budget=budget, replicas=replicas)


def chosen(config: EngineConfig, runtime: Runtime) -> str:
    """What a settled config and its runtime run on, in a line (the server logs it when it starts, after the
    warm-up)."""
    device = torch.device(config.device)
    name = f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "cpu"
    pool, tree = runtime.runner.pool, runtime.runner.tree
    host = "" if tree is None or tree.host is None else f", host KV tier {tree.host.capacity_bytes / 2 ** 30:.1f} GiB"
    if host and tree.host.restore_s is not None:  # timed by the warm-up
        choice = "copies back" if tree.host.restores else "computes again"
        host += (f" ({choice}: a pass copied back in {tree.host.restore_s:.3f} s, computed in "
                 f"{tree.host.recompute_s:.3f} s)")
    if tree is not None and tree.disk is not None:
        host += f", disk KV tier {tree.disk.capacity_bytes / 2 ** 30:.1f} GiB"
    replicas = "" if runtime.replicas is None else f", {runtime.replicas.count} replicas"
    return (f"{runtime.model_id} on {name}, {config.precision}, token budget {config.token_budget:,}, "
            f"KV pool {pool.capacity_bytes / 2 ** 30:.1f} GiB{host}{replicas}; embeddings "
            f"{runtime.embeddings.name} ({runtime.embeddings.dims} dimensions)")


def load_runtime(config: EngineConfig | None = None) -> Runtime:
    """Load weights, tokenizer and chat template of the configured model and wrap them in a runtime for this
    process's device (the config settled for this machine first; its pool and tiers a share of what the
    device and host have where `config.replicas` share them: serving.py starts the others)."""
    return load(config)[0]


def load(config: EngineConfig | None = None) -> tuple[Runtime, EngineConfig]:
    """`load_runtime`, and the config as settled and sized: the KV pool's bytes and the tiers' as this runtime
    took them (what each replica beside it takes)."""
    config = settled(config or EngineConfig())
    return _runtime(*_parts(config), config)


def load_embeddings(config: EngineConfig) -> Embeddings:
    """The embedding model AI_EMBED asks: `config.embed_model` loaded now, a decoder on the config's device
    whose runtime keeps no KV (DecoderEmbedding), its layers run once here (compiled then, and on a GPU its
    passes' graphs captured, rather than inside the first statement that embeds); None: the embedded static
    model, loaded on first use."""
    settled_config = settled(replace(config, model=config.embed_model or config.model, replicas=1))
    if config.embed_model is None:
        return Embeddings(device=settled_config.device)
    model_id, model, tokenizer, frame = _parts(settled_config)
    # Each text computed in full, longest first ("naive"; decoder_embedding.py says why).
    embedding = DecoderEmbedding(Runtime(model_id, model, tokenizer, frame, "naive", settled_config.token_budget,
                                         kv_bytes=0, names=(config.embed_model,)))
    embedding.runtime.warm_up(full=False)
    return Embeddings(lambda: embedding, embedding.name, embedding.dims, names=(config.embed_model,),
                      device=settled_config.device)


def _parts(config: EngineConfig) -> tuple[str, Decoder, Tokenizer, ChatFrame]:
    """The configured model's id, weights (on its device, in its precision), tokenizer and chat frame."""
    if config.precision not in DTYPES:
        raise InvalidArgument(f"precision {config.precision!r} is not available; use one of {', '.join(DTYPES)}")
    if config.attention_layout not in ATTENTION:
        raise InvalidArgument(f"attention {config.attention!r} is not available; use one of {', '.join(ATTENTION)}")
    if config.attention_layout == "varlen" and not config.flash_capable:
        raise InvalidArgument("attention 'varlen' runs on a CUDA device in bf16 or fp8")
    if config.model and config.model.startswith("dummy:"):
        shape = config.model.removeprefix("dummy:")
        # Drawn in fp32 whatever the precision, so every precision rounds the same weights.
        with building_on(config.device, torch.float32):
            model = _dummy(shape)
        tokenizer, frame = _tokenizer_and_frame(config.tokenizer)
        return f"dummy-{shape}", prepare(model, config), tokenizer, frame
    model_id, path = resolve(config.model)
    if path.is_dir():
        checkpoint = load_directory(path)
        tokenizer, frame = _tokenizer_and_frame(config.tokenizer or path)
        return model_id, prepare(_loaded(checkpoint.config, checkpoint.state_dict), config), tokenizer, frame
    gguf = gguf_cache.load(path)
    return (model_id, prepare(_loaded(gguf.config, gguf.state_dict), config), Tokenizer.from_gguf_vocab(gguf.vocab),
            ChatFrame.from_template(gguf.chat_template))


def pass_bytes(model: Decoder, token_budget: int) -> int:
    """A generous bound on one forward pass's activations: each token's hidden states, queries, keys,
    values and MLP tensors in the activation dtype, three times over (temporaries, the compiled graph's)."""
    c = model.config
    per_token = 4 * c.hidden_size + 3 * c.intermediate_size + 2 * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    return 3 * token_budget * per_token * model.embed_tokens.weight.element_size()


def _runtime(model_id: str, model: Decoder, tokenizer: Tokenizer, frame: ChatFrame,
             config: EngineConfig) -> tuple[Runtime, EngineConfig]:
    budget = config.kv_cache_bytes
    if budget is None:  # replicas sharing a GPU: what it has free, less the others' weights and passes, shared
        device = next(model.parameters()).device
        sharing = -(-config.replicas // torch.cuda.device_count()) if device.type == "cuda" else 1
        activations = pass_bytes(model, config.token_budget)
        weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        others = (sharing - 1) * (activations + RESERVE + weights)
        budget = max(0, default_pool_bytes(device, activations) - others) // sharing
    host, disk = _tiers(config, next(model.parameters()).device)
    runtime = Runtime(model_id, model, tokenizer, frame, config.strategy, config.token_budget, config.decisions,
                      kv_bytes=budget, kv_host_bytes=host, kv_disk=disk, names=(config.model or DEFAULT_MODEL,))
    local = config.ray is None  # a Ray replica sizes its own host's tiers
    return runtime, replace(config, kv_cache_bytes=budget, kv_host_bytes=host if local else config.kv_host_bytes,
                            kv_disk_bytes=disk[1] if local and disk else config.kv_disk_bytes)


def _tiers(config: EngineConfig, device: torch.device) -> tuple[int, tuple[Path, int] | None]:
    """The host tier's bytes and the disk tier's (directory, bytes; None: none) of a runtime on `device`: as
    configured, else shares of this host's memory and disk among the replicas it runs (a Ray replica sizes
    its own host's)."""
    replicas = config.replicas if config.ray is None else 1
    host = config.kv_host_bytes if config.kv_host_bytes is not None else default_host_bytes(device, replicas)
    if config.kv_disk_dir is None:
        return host, None
    directory = Path(config.kv_disk_dir)
    return host, (directory, config.kv_disk_bytes or default_disk_bytes(directory, replicas))


def replica_device(device: str, index: int) -> str:
    """The device of replica `index`: the next GPU (round robin over those present), or the CPU.

    >>> replica_device("cpu", 1)
    'cpu'
    """
    kind = torch.device(device).type
    return f"cuda:{index % torch.cuda.device_count()}" if kind == "cuda" else kind
