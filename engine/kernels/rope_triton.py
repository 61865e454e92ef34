"""Triton kernel of Qwen3's q/k heads in bf16/fp16 (CUDA): each head RMS-normed, then rotated (half-rotation rope).

- Reads the q and k heads of the joined q/k/v projection's rows once (any row stride: v is not touched) and
  the rotary tables of the tokens; writes q (tokens, heads, d) and k (tokens, kv_heads, d), or into
  buffers the caller names (a captured pass's).
- One program takes ROWS tokens of one head: the head's two halves loaded side by side, the norm's mean of
  squares in fp32, the normed head rounded to the activations' dtype as the model's RMSNorm rounds it, the
  rotation computed in fp32 and rounded once.
- In a 16K-token pass of the Qwen3-Embedding-0.6B shape on an H100: 2.54 ms (~2.5 TB/s), as fast as
  Inductor's best compile of the same work (2.56 ms, two kernels), where Inductor also chose two slower
  loops (3.40 ms) by the compile (bench/GPU_NOTES.md).
- Reference: the model's RMSNorm and apply_rope in fp32 (tests/engine/test_rope_triton.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS, WARPS = 16, 4


@triton.jit
def _norm_rope_kernel(x_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, tokens, stride_x, stride_cos,
                      stride_sin, stride_q, stride_k, eps, HEADS: tl.constexpr, HALF: tl.constexpr,
                      ROWS: tl.constexpr):
    """ROWS tokens of head `program_id(1)` (q heads first, then k heads, as in the joined projection)."""
    head = tl.program_id(1)
    t = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    d = tl.arange(0, HALF)
    mask = (t < tokens)[:, None]
    src = x_ptr + t[:, None] * stride_x + head * 2 * HALF + d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)[:, None]
    if head < HEADS:
        w_ptr = qw_ptr
        dst = q_ptr + t[:, None] * stride_q + head * 2 * HALF + d[None, :]
    else:
        w_ptr = kw_ptr
        dst = k_ptr + t[:, None] * stride_k + (head - HEADS) * 2 * HALF + d[None, :]
    kind = dst.dtype.element_ty
    n1 = (x1 * rstd * tl.load(w_ptr + d).to(tl.float32)[None, :]).to(kind).to(tl.float32)
    n2 = (x2 * rstd * tl.load(w_ptr + HALF + d).to(tl.float32)[None, :]).to(kind).to(tl.float32)
    c = cos_ptr + t[:, None] * stride_cos + d[None, :]
    s = sin_ptr + t[:, None] * stride_sin + d[None, :]
    c1, c2 = tl.load(c, mask=mask, other=0.0).to(tl.float32), tl.load(c + HALF, mask=mask, other=0.0).to(tl.float32)
    s1, s2 = tl.load(s, mask=mask, other=0.0).to(tl.float32), tl.load(s + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst, (n1 * c1 - n2 * s1).to(kind), mask=mask)
    tl.store(dst + HALF, (n2 * c2 + n1 * s2).to(kind), mask=mask)


def norm_rope(joined: torch.Tensor, heads: int, kv_heads: int, q_weight: torch.Tensor, k_weight: torch.Tensor,
              eps: float, cos: torch.Tensor, sin: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor] | None = None,
              rows: int = ROWS, **settings: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q (tokens, heads, d) and k (tokens, kv_heads, d), each head RMS-normed by its weight and rotated by
    the tables cos, sin (tokens, d), from `joined` (tokens, ≥ (heads + kv_heads)·d): a row of the q heads
    then the k heads, d = the weights' length; written into `out` (q, k) where given (rows of heads
    adjacent). `rows` and Triton's launch `settings` for the probe; the shipped ones by default."""
    head_dim = q_weight.shape[0]
    tokens = joined.shape[0]
    if joined.stride(-1) != 1:
        joined = joined.contiguous()
    cos, sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (cos, sin))
    if out is None:
        out = (torch.empty(tokens, heads, head_dim, device=joined.device, dtype=joined.dtype),
               torch.empty(tokens, kv_heads, head_dim, device=joined.device, dtype=joined.dtype))
    q, k = out
    if tokens:
        _norm_rope_kernel[(triton.cdiv(tokens, rows), heads + kv_heads)](
            joined, q_weight, k_weight, cos, sin, q, k, tokens, joined.stride(0), cos.stride(0), sin.stride(0),
            q.stride(0), k.stride(0), eps, HEADS=heads, HALF=head_dim // 2, ROWS=rows,
            **(settings or {"num_warps": WARPS}))
    return q, k
