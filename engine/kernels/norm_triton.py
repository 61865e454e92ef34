"""Triton kernel of the decoder's RMSNorm in bf16/fp16 (CUDA): each row scaled by its root mean square and the weight.

- One program takes ROWS rows, each whole (its columns padded to a power of two and masked): the mean of
  squares, the scale and the weight in fp32, rounded once to the row's dtype, as the model's RMSNorm
  (decoder.RMSNorm) computes them.
- Reads each row once and writes it once (any row stride in and out).
- Used where a layer's token-wise parts run by our kernels alone (decoder.py's `DecoderLayer`); reference:
  RMSNorm in fp32 (tests/engine/test_norm_triton.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ELEMENTS, WARPS = 4096, 4  # a program's rows hold about this many elements


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, rows, stride_x, stride_out, eps, HIDDEN: tl.constexpr,
                     BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """Rows ROWS·program_id(0) on: out = x · rsqrt(mean(x²) + eps) · w."""
    r = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    c = tl.arange(0, BLOCK)
    inside = c < HIDDEN
    mask = (r < rows)[:, None] & inside[None, :]
    x = tl.load(x_ptr + r[:, None] * stride_x + c[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / HIDDEN + eps)
    w = tl.load(w_ptr + c, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + r[:, None] * stride_out + c[None, :],
             (x * rstd[:, None] * w[None, :]).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of rows x (tokens, hidden), columns adjacent, by weight (hidden,): a new (tokens, hidden)
    tensor in x's dtype."""
    tokens, hidden = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(tokens, hidden, device=x.device, dtype=x.dtype)
    block = triton.next_power_of_2(hidden)
    rows = max(1, ELEMENTS // block)
    if tokens:
        _rms_norm_kernel[(triton.cdiv(tokens, rows),)](x, weight, out, tokens, x.stride(0), out.stride(0), eps,
                                                       HIDDEN=hidden, BLOCK=block, ROWS=rows, num_warps=WARPS)
    return out
