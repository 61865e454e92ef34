"""The Llama-family decoder (Llama, Qwen2, Qwen3) in plain torch, prefill only."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .kv import KV


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale, computed in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape positions.shape + (head_dim,), half-rotation (HF) layout."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.float()[..., None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (batch, heads, seq, head_dim) by the tables (batch, seq, head_dim)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


@dataclass
class Past:
    """Resident KV that a batch attends to before its own tokens.

    Row b attends to the first lengths[b] entries of its run; `runs` holds one
    KV per row (None: no past), or a single KV shared by every row. A layer's
    keys and values are padded into one tensor only when that layer runs, so
    the padding never exists for all layers at once.
    """

    runs: list[KV | None]
    lengths: torch.Tensor

    @property
    def width(self) -> int:
        return int(self.lengths.max())

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) of one layer: (1 or batch, kv_heads, width, head_dim)."""
        first = self.runs[0]
        if len(self.runs) == 1:
            return first.keys[index][None], first.values[index][None]
        template = next(r for r in self.runs if r is not None)
        heads, _, dim = template.keys[index].shape
        keys = template.keys[index].new_zeros(len(self.runs), heads, self.width, dim)
        values = torch.zeros_like(keys)
        for b, run in enumerate(self.runs):
            if run is not None:
                keys[b, :, : len(run)] = run.keys[index]
                values[b, :, : len(run)] = run.values[index]
        return keys, values


def attention_mask(q: int, past: Past | None, batch: int) -> torch.Tensor | None:
    """(batch, 1, q, c + q) booleans: each row's valid past, then causal over its own tokens."""
    if past is None:
        return None
    device = past.lengths.device
    c = past.width
    past_ok = torch.arange(c, device=device)[None, :] < past.lengths[:, None]
    causal = torch.ones(q, q, dtype=torch.bool, device=device).tril()
    mask = torch.cat([past_ok[:, None, :].expand(batch, q, c), causal.expand(batch, q, q)], dim=-1)
    return mask[:, None]


class Attention(nn.Module):
    """Grouped-query self-attention, optionally with per-head q/k RMSNorm (Qwen3)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.num_heads * hd, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past_k: torch.Tensor | None,
                past_v: torch.Tensor | None, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Output, and this block's own keys and values (batch, kv_heads, seq, head_dim)."""
        b, s, _ = x.shape
        hd = self.cfg.head_dim
        q = self.q_proj(x).view(b, s, self.cfg.num_heads, hd)
        k = self.k_proj(x).view(b, s, self.cfg.num_kv_heads, hd)
        v = self.v_proj(x).view(b, s, self.cfg.num_kv_heads, hd).transpose(1, 2)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k = apply_rope(k.transpose(1, 2), cos, sin)
        if past_k is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            keys = torch.cat([past_k.expand(b, -1, -1, -1), k], dim=2)
            values = torch.cat([past_v.expand(b, -1, -1, -1), v], dim=2)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1)), k, v


class MLP(nn.Module):
    """SwiGLU feed-forward block."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP with residual connections."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past_k: torch.Tensor | None,
                past_v: torch.Tensor | None, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn, k, v = self.self_attn(self.input_layernorm(x), cos, sin, past_k, past_v, mask)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


class Decoder(nn.Module):
    """A causal decoder whose head is evaluated only at chosen positions and token ids.

    Parameter names follow the HF layout (`embed_tokens`, `layers.N.self_attn.q_proj`,
    ...) without the `model.` prefix, so HF state dicts load after stripping it.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def head_weight(self) -> torch.Tensor:
        """The output projection (vocab, hidden), tied to the embeddings where the model says so."""
        return self.embed_tokens.weight if self.config.tie_embeddings else self.lm_head.weight

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor, past: Past | None = None,
                keep_kv: bool = False) -> tuple[torch.Tensor, list[torch.Tensor] | None, list[torch.Tensor] | None]:
        """Prefill right-padded rows, optionally after resident KV.

        ids: (batch, q) new tokens, row b valid up to lengths[b]; causal attention
        keeps padding invisible to every real position. Returns the final-normed
        hidden state at each row's last valid position, and with keep_kv the new
        tokens' keys and values per layer (batch, kv_heads, q, head_dim).
        """
        batch, q = ids.shape
        offset = past.lengths[:, None] if past is not None else 0
        positions = torch.arange(q, device=ids.device)[None, :] + offset
        cos, sin = rope_tables(positions.expand(batch, q), self.config.head_dim, self.config.rope_theta)
        mask = attention_mask(q, past, batch)
        x = self.embed_tokens(ids)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            past_k, past_v = past.layer(i) if past is not None else (None, None)
            x, k, v = layer(x, cos, sin, past_k, past_v, mask)
            if keep_kv:
                keys.append(k)
                values.append(v)
        last = x[torch.arange(batch, device=ids.device), lengths - 1]
        return self.norm(last), (keys if keep_kv else None), (values if keep_kv else None)

    def label_logits(self, hidden: torch.Tensor, label_ids: torch.Tensor) -> torch.Tensor:
        """The head cut to label_ids, applied to final hidden states: (batch, n_labels) in fp32."""
        return hidden.float() @ self.head_weight()[label_ids].float().T
