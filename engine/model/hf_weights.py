"""HF model directories (config.json, *.safetensors, tokenizer.json) and the local Hugging Face cache."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from quail.engine.errors import NotFound
from quail.engine.model.config import ModelConfig

TEMPLATE_FILE = "chat_template.jinja"


@dataclass
class HFCheckpoint:
    """What an HF directory holds: the model's shape, its weights in our naming, its chat template."""

    config: ModelConfig
    state_dict: dict[str, torch.Tensor]
    chat_template: str | None


def is_model_directory(path: Path) -> bool:
    return (path / "config.json").is_file()


def chat_template(directory: Path) -> str | None:
    """The chat template beside a tokenizer: chat_template.jinja, else tokenizer_config.json's."""
    template = directory / TEMPLATE_FILE
    if template.is_file():
        return template.read_text()
    config = directory / "tokenizer_config.json"
    if config.is_file():
        return json.loads(config.read_text()).get("chat_template")
    return None


def load_directory(directory: Path) -> HFCheckpoint:
    """Read config.json and every *.safetensors file (names without the `model.` prefix)."""
    from safetensors.torch import load_file

    config = ModelConfig.from_hf(json.loads((directory / "config.json").read_text()))
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise NotFound(f"no *.safetensors weights in {directory}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update({k.removeprefix("model."): v for k, v in load_file(file).items()})
    if config.tie_embeddings:
        state.pop("lm_head.weight", None)
    return HFCheckpoint(config, state, chat_template(directory))


def hub_cache() -> Path:
    """The Hugging Face hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"


def cached_snapshot(repo_id: str, revision: str = "main") -> Path | None:
    """The directory of a repo's snapshot in the local hub cache, or None when it is not there."""
    repo = hub_cache() / f"models--{repo_id.replace('/', '--')}"
    ref = repo / "refs" / revision
    snapshot = repo / "snapshots" / (ref.read_text().strip() if ref.is_file() else revision)
    return snapshot if is_model_directory(snapshot) else None


def download(repo_id: str) -> Path:
    """Fetch a repo's config, weights and tokenizer into the hub cache (needs huggingface_hub and network)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise NotFound(f"model {repo_id!r} is not in the Hugging Face cache ({hub_cache()}) and "
                       "huggingface_hub is not installed to download it") from exc
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false"):
        raise NotFound(f"model {repo_id!r} is not in the Hugging Face cache ({hub_cache()}) and HF_HUB_OFFLINE is set")
    try:
        path = snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.jinja"])
    except Exception as exc:
        raise NotFound(f"model {repo_id!r} is not in the Hugging Face cache ({hub_cache()}) and could not be "
                       f"downloaded: {type(exc).__name__}") from exc
    return Path(path)
