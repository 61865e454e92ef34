"""The Llama-family decoder (Llama, Qwen2, Qwen3) in plain torch, prefill only."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


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

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        hd = self.cfg.head_dim
        q = self.q_proj(x).view(b, s, self.cfg.num_heads, hd)
        k = self.k_proj(x).view(b, s, self.cfg.num_kv_heads, hd)
        v = self.v_proj(x).view(b, s, self.cfg.num_kv_heads, hd).transpose(1, 2)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k = apply_rope(k.transpose(1, 2), cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


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

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


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

    def last_hidden(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden state at position lengths-1 of each right-padded row.

        ids: (batch, seq) token ids, right-padded; causal attention keeps padding
        invisible to every real position, so no mask is needed.
        """
        positions = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
        cos, sin = rope_tables(positions, self.config.head_dim, self.config.rope_theta)
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos.to(x.dtype), sin.to(x.dtype))
        last = x[torch.arange(ids.shape[0], device=ids.device), lengths - 1]
        return self.norm(last)

    def label_logits(self, ids: torch.Tensor, lengths: torch.Tensor, label_ids: torch.Tensor) -> torch.Tensor:
        """Logits over label_ids only, at each row's last position: (batch, n_labels)."""
        hidden = self.last_hidden(ids, lengths)
        return hidden.float() @ self.head_weight()[label_ids].float().T
