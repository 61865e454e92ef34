"""A GGUF file read once is read back from the cache: the same weights, config, vocabulary and template."""

from __future__ import annotations

import os

import torch

from quail.engine.model import gguf_cache
from quail.engine.model.embedded import embedded_gguf
from quail.engine.model.config import ModelConfig
from quail.engine.model.gguf_weights import GGUFModel, GGUFVocab, read_vocab


def test_a_gguf_file_read_once_comes_back_from_the_cache_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("QUAIL_CACHE", str(tmp_path))
    source = tmp_path / "model.gguf"
    os.symlink(embedded_gguf(), source)
    first = gguf_cache.load(source)  # read from the file, then kept
    (entry,) = (tmp_path / "gguf").iterdir()
    assert sorted(p.name for p in entry.iterdir()) == ["facts.json", "weights.pt"]
    again = gguf_cache.load(source)
    assert again.config == first.config and again.vocab == first.vocab
    assert again.chat_template == first.chat_template and again.state_dict.keys() == first.state_dict.keys()
    assert all(torch.equal(again.state_dict[k], t) for k, t in first.state_dict.items())
    assert gguf_cache.vocab(source) == read_vocab(source)
    assert len(list((tmp_path / "gguf").iterdir())) == 1, "read back, not written again"


def test_a_changed_file_is_read_again_and_a_large_one_never_kept(tmp_path, monkeypatch):
    """Which reads go to the file (its reader stubbed by a small model: the logic of keys and limits)."""
    monkeypatch.setenv("QUAIL_CACHE", str(tmp_path))
    small = GGUFModel(ModelConfig("llama", 4, 4, 1, 1, 1, 4, 4, 1e4, 1e-5), {"norm.weight": torch.ones(4)},
                      GGUFVocab(["a"], [], [1], "default", None, None), None)
    reads = []
    monkeypatch.setattr(gguf_cache, "load_gguf", lambda path: reads.append(path) or small)
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF")
    gguf_cache.load(source)
    gguf_cache.load(source)
    assert len(reads) == 1
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert torch.equal(gguf_cache.load(source).state_dict["norm.weight"], torch.ones(4))
    assert len(reads) == 2, "a file modified since is read again"
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2 * 10**9))
    monkeypatch.setattr(gguf_cache, "MAX_BYTES", 0)
    gguf_cache.load(source)
    gguf_cache.load(source)
    assert len(reads) == 4, "over MAX_BYTES: read every time, never kept"
