"""Configuration: the shape of a decoder (model facts) and how an engine runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

DECISIONS = ("model", "hash", "rule")  # how yes/no answers are decided (runtime.Runtime's `decisions`)
ATTENTION = ("buckets", "varlen")  # rows padded per length bucket for cuDNN, or one flash varlen call


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-family decoder (Llama, Qwen2, Qwen3)."""

    arch: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    qk_norm: bool = False
    attention_bias: bool = False
    tie_embeddings: bool = True
    max_position: int = 8192

    @property
    def layer_weights(self) -> tuple[int, int]:
        """Weights of one layer's attention projections (q, k, v, o) and of its MLP: a token's multiply-adds there."""
        q, kv, d, h = self.num_heads, self.num_kv_heads, self.head_dim, self.hidden_size
        return h * (q + 2 * kv) * d + q * d * h, 3 * h * self.intermediate_size

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> "ModelConfig":
        """Read an HF `config.json` dictionary of a Llama, Qwen2 or Qwen3 model."""
        arch = cfg["model_type"]
        if arch not in ("llama", "qwen2", "qwen3"):
            raise ValueError(f"unsupported model_type {arch!r} (llama, qwen2, qwen3)")
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_parameters") or {}
        return cls(
            arch=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate_size=cfg["intermediate_size"],
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            qk_norm=arch == "qwen3",
            attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position=int(cfg.get("max_position_embeddings", 8192)),
        )


@dataclass(frozen=True)
class EngineConfig:
    """Which model runs where, and how.

    backend: accepted as scripts for the seed system pass it; Quail always runs
    its own runtime. model: a model name or path (None: the embedded SmolLM2-135M; "dummy:<shape>":
    random weights of a named shape; an HF directory, a .gguf file, or an HF repo
    id in the local cache); device: "cpu", "cuda" or "auto" (CUDA when present); precision: "fp32", "bf16",
    "auto" (bf16 on a GPU, fp32 on the CPU) or
    "fp8" (e4m3 linear layers, bf16 elsewhere); compile: compile the layers'
    token-wise parts (None: on CUDA only); strategy: "quail" (share every common prefix) or the baselines
    "naive" and "prefix"; token_budget: new tokens per forward pass (None: 16,384 on a GPU, 1,024 on the CPU);
    "auto" and None are settled for the machine when the model loads (loading.settled);
    decisions: "model", or "hash" / "rule" for benchmarks (DECISIONS); tokenizer: an HF tokenizer
    directory (tokenizer.json, chat_template.jinja) for dummy weights (None: the
    embedded model's); sol_device: the device constants the speed of light uses
    ("cpu", "h100-sxm", "h200"; None: "cpu" on the CPU, else none); kv_cache_bytes:
    the device's KV pool, where what queries compute stays for later steps and queries
    (kv/pool.py, kv/resident.py; None: 1 GiB on the CPU, on a GPU 90% of what the weights and
    a pass leave free; 0: nothing stays);
    kv_host_bytes: pinned host memory where KV the pool has no room for goes, and from where it is copied
    back when that is faster than computing it (kv/host_tier.py; None: on a GPU half the host memory
    available at start, within the container's memory limit, shared by this host's replicas; on the CPU
    none; 0: none); kv_disk_dir: a
    local directory where a file takes the KV the host tier has no room for (None: no disk tier),
    kv_disk_bytes: that file's size (None: half the disk's free space, shared by this host's replicas);
    attention: how rows attend to their own
    tokens: "buckets" (rows padded per length bucket; cuDNN on a GPU) or "varlen" (one
    flash varlen call, no padding; CUDA in bf16 or fp8 only; None: varlen where it runs,
    else buckets); replicas: runtimes serving the model, one per GPU (the server's own, and the others in
    processes of their own, requests routed to the one holding their document: runtime/replicas.py; on the
    CPU they share its cores; None: one per CUDA GPU present, settled when the model loads); ray: the
    other replicas are Ray actors of the cluster at this address ("auto": a local Ray started by the
    server), else processes of this host (None); embed_model: the model AI_EMBED and AI_SIMILARITY embed
    with, a decoder named as `model` is (the final hidden state at a text's last token, as Qwen3-Embedding;
    "dummy:qwen3-embedding-0.6b" and "dummy:qwen3-embedding-4b" are its shapes), loaded at start on the same
    device and precision (None: the embedded static model, fetched on first use).
    """

    model: str | None = None
    device: str = "cpu"
    gpus: int = 1
    precision: str = "fp32"
    strategy: str = "quail"
    token_budget: int | None = None
    decisions: str = "model"
    tokenizer: str | None = None
    sol_device: str | None = None
    compile: bool | None = None
    kv_cache_bytes: int | None = None
    kv_host_bytes: int | None = None
    kv_disk_dir: str | None = None
    kv_disk_bytes: int | None = None
    attention: str | None = None
    backend: str | None = None
    replicas: int | None = 1
    ray: str | None = None
    embed_model: str | None = None

    @property
    def compiled(self) -> bool:
        return self.compile if self.compile is not None else self.device.startswith("cuda")

    @property
    def flash_capable(self) -> bool:
        """Whether flash kernels run here: CUDA in bf16 or fp8."""
        return self.device.startswith("cuda") and self.precision != "fp32"

    @property
    def attention_layout(self) -> str:
        """attention, else "varlen" where flash runs (no cuDNN plan per new shape: faster first runs,
        bench/GPU_NOTES.md), else "buckets"."""
        if self.attention:
            return self.attention
        return "varlen" if self.flash_capable else "buckets"

    @property
    def speed_of_light_device(self) -> str | None:
        """The device constants speed-of-light figures use: sol_device, else "cpu" on the CPU, else none."""
        if self.sol_device:
            return self.sol_device
        return "cpu" if self.device == "cpu" else None
