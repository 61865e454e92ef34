"""GGUF files read once: their dequantized weights and facts kept on disk, so later starts map them instead.

Reading a GGUF file parses its metadata (the tokenizer's vocabulary is tens of
thousands of fields) and dequantizes every tensor: seconds on a CPU, each
start. `load` keeps what `gguf_weights.load_gguf` returns under
`cache_dir()/gguf/<key>` (key: the file's path, size and modification time),
the weights as one fp32 torch file memory-mapped when read back; files whose
fp32 weights exceed MAX_BYTES are read directly every time, never cached.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from quail.engine.model.config import ModelConfig
from quail.engine.model.embedded import cache_dir
from quail.engine.model.gguf_weights import GGUFModel, GGUFVocab, load_gguf, read_vocab

MAX_BYTES = 4 << 30  # fp32 weights kept on disk at most per file (the embedded model's: 0.5 GiB)


def _entry(path: Path) -> Path:
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:32]
    return cache_dir() / "gguf" / key


def _facts(entry: Path) -> tuple[ModelConfig, GGUFVocab, str | None] | None:
    """The config, vocabulary and chat template a cache entry holds; None when there is no entry."""
    if not (entry / "facts.json").is_file():
        return None
    facts = json.loads((entry / "facts.json").read_text())
    return ModelConfig(**facts["config"]), GGUFVocab(**facts["vocab"]), facts["chat_template"]


def vocab(path: str | Path) -> tuple[GGUFVocab, str | None]:
    """`read_vocab(path)`, from the cache when this file was read before."""
    facts = _facts(_entry(Path(path)))
    return read_vocab(path) if facts is None else facts[1:]


def _write(entry: Path, model: GGUFModel) -> None:
    """The entry written whole into a scratch folder, then renamed into place (a racing writer's kept)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=entry.parent))
    try:
        torch.save(model.state_dict, scratch / "weights.pt")
        facts = {"config": dataclasses.asdict(model.config), "vocab": dataclasses.asdict(model.vocab),
                 "chat_template": model.chat_template}
        (scratch / "facts.json").write_text(json.dumps(facts))
        os.rename(scratch, entry)
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)


def load(path: str | Path) -> GGUFModel:
    """`load_gguf(path)`, from the cache when this file was read before (and kept there if small enough)."""
    path = Path(path)
    entry = _entry(path)
    facts = _facts(entry)
    if facts is not None:
        config, vocabulary, template = facts
        return GGUFModel(config, torch.load(entry / "weights.pt", mmap=True, weights_only=True), vocabulary, template)
    model = load_gguf(path)
    if sum(t.numel() * t.element_size() for t in model.state_dict.values()) <= MAX_BYTES:
        _write(entry, model)
    return model
