"""A GGUF file read once is read back from the cache: the same weights, config, vocabulary and template."""

from __future__ import annotations

import os

import gguf
import numpy as np
import torch

from quail.engine.model import gguf_cache
from quail.engine.model.config import ModelConfig
from quail.engine.model.gguf_weights import GGUFModel, GGUFVocab, load_gguf, read_vocab

LAYER = {"attn_norm": (32,), "attn_q": (32, 32), "attn_k": (16, 32), "attn_v": (16, 32), "attn_output": (32, 32),
         "ffn_norm": (32,), "ffn_gate": (64, 32), "ffn_up": (64, 32), "ffn_down": (32, 64)}


def _small_llama(path) -> None:
    """A two-layer Llama of hidden size 32 as llama.cpp lays one out: 2-D weights in Q4_1, norms in fp32, a
    vocabulary of four tokens and a chat template (the embedded model's file, 0.5 GB dequantized, takes
    seconds to write to a cache)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((writer.add_embedding_length, 32), (writer.add_block_count, 2), (writer.add_head_count, 4),
                       (writer.add_head_count_kv, 2), (writer.add_feed_forward_length, 64),
                       (writer.add_layer_norm_rms_eps, 1e-5), (writer.add_context_length, 64)):
        add(value)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "ab", "<|im_end|>"])
    writer.add_token_types([1, 1, 1, 3])
    writer.add_token_merges(["a b"])
    writer.add_eos_token_id(3)
    writer.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    rng = np.random.default_rng(0)
    tensors = {"token_embd.weight": (4, 32), "output_norm.weight": (32,),
               **{f"blk.{k}.{name}.weight": shape for k in range(2) for name, shape in LAYER.items()}}
    for name, shape in tensors.items():
        values = rng.standard_normal(shape, dtype=np.float32)
        if len(shape) == 2:
            writer.add_tensor(name, gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q4_1),
                              raw_dtype=gguf.GGMLQuantizationType.Q4_1)
        else:
            writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_gguf_file_read_once_comes_back_from_the_cache_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("QUAIL_CACHE", str(tmp_path))
    source = tmp_path / "model.gguf"
    _small_llama(source)
    first = gguf_cache.load(source)  # read from the file, then kept
    (entry,) = (tmp_path / "gguf").iterdir()
    assert sorted(p.name for p in entry.iterdir()) == ["facts.json", "weights.pt"]
    assert first.config.num_layers == 2 and first.vocab.merges == ["a b"] and first.chat_template
    again = gguf_cache.load(source)
    assert again.config == first.config and again.vocab == first.vocab
    assert again.chat_template == first.chat_template and again.state_dict.keys() == first.state_dict.keys()
    assert all(torch.equal(again.state_dict[k], t) for k, t in first.state_dict.items())
    direct = load_gguf(source)
    assert all(torch.equal(direct.state_dict[k], t) for k, t in first.state_dict.items())
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
