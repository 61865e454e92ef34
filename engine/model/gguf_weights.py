"""GGUF files: model facts, dequantized weights in HF naming, tokenizer vocabulary, chat template."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from quail.engine.model import gguf_file
from quail.engine.model.config import ModelConfig

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")


@dataclass
class GGUFVocab:
    """The tokenizer as a GGUF file stores it (a GPT-2 style byte-level BPE)."""

    tokens: list[str]
    merges: list[str]
    token_types: list[int]
    pre: str
    bos_id: int | None
    eos_id: int | None


@dataclass
class GGUFModel:
    """Everything the runtime needs out of one GGUF file."""

    config: ModelConfig
    state_dict: dict[str, torch.Tensor]
    vocab: GGUFVocab
    chat_template: str | None


def _config(fields: dict[str, object], tensors: set[str]) -> ModelConfig:
    arch = fields.get("general.architecture")
    if arch not in ("llama", "qwen2", "qwen3"):
        raise ValueError(f"unsupported GGUF architecture {arch!r} (llama, qwen2, qwen3)")
    hidden = int(fields.get(f"{arch}.embedding_length"))
    heads = int(fields.get(f"{arch}.attention.head_count"))
    head_dim = int(fields.get(f"{arch}.attention.key_length", hidden // heads))
    vocab = fields.get(f"{arch}.vocab_size") or len(fields["tokenizer.ggml.tokens"])
    return ModelConfig(
        arch=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        num_layers=int(fields.get(f"{arch}.block_count")),
        num_heads=heads,
        num_kv_heads=int(fields.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        intermediate_size=int(fields.get(f"{arch}.feed_forward_length")),
        rope_theta=float(fields.get(f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(fields.get(f"{arch}.attention.layer_norm_rms_epsilon")),
        qk_norm=arch == "qwen3",
        attention_bias="blk.0.attn_q.bias" in tensors,
        tie_embeddings="output.weight" not in tensors,
        max_position=int(fields.get(f"{arch}.context_length", 8192)),
    )


def _hf_name(name: str) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    match = _BLOCK.fullmatch(name)
    if not match or match.group(2) not in _LAYER_NAMES:
        raise ValueError(f"unexpected GGUF tensor {name!r}")
    return f"layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"


def unpermute_rotary(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's interleaved-rotary row order, back to HF's half-rotation order."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _vocab(fields: dict[str, object]) -> GGUFVocab:
    return GGUFVocab(
        tokens=list(fields["tokenizer.ggml.tokens"]),
        merges=list(fields.get("tokenizer.ggml.merges", [])),
        token_types=[int(t) for t in fields["tokenizer.ggml.token_type"]],
        pre=str(fields.get("tokenizer.ggml.pre", "default")),
        bos_id=fields.get("tokenizer.ggml.bos_token_id"),
        eos_id=fields.get("tokenizer.ggml.eos_token_id"),
    )


def read_vocab(path: str | Path) -> tuple[GGUFVocab, str | None]:
    """The tokenizer vocabulary and chat template of a GGUF file, without touching its tensors."""
    fields = gguf_file.read(path).fields
    return _vocab(fields), fields.get("tokenizer.chat_template")


def load_gguf(path: str | Path) -> GGUFModel:
    """Read a GGUF file, dequantizing every tensor to fp32."""
    from gguf import quants

    file = gguf_file.read(path)
    config = _config(file.fields, {t.name for t in file.tensors})
    state: dict[str, torch.Tensor] = {}
    for tensor in file.tensors:
        weight = np.asarray(quants.dequantize(tensor.data, tensor.type), dtype=np.float32)
        name = _hf_name(tensor.name)
        if config.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_heads if "q_proj" in name else config.num_kv_heads
            weight = unpermute_rotary(weight, heads)
        state[name] = torch.tensor(weight)
    return GGUFModel(config, state, _vocab(file.fields), file.fields.get("tokenizer.chat_template"))
