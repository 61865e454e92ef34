"""Triton kernel of the SwiGLU block in bf16/fp16 (CUDA): silu(gate) · up from the joined gate/up projection.

One program takes COLS columns of one row of the joined GEMM's output (tokens, 2·inter), reads the gate and
up halves there once, computes in fp32 and rounds once: ~3 TB/s on an H100, where Inductor's fused kernel
of the same product, compiled for any token count, ran at ~1.7. A GEMM with the product in its epilogue
(Triton) was slower than torch's GEMM and this pass. Reference: F.silu(gate) · up in fp32
(tests/engine/test_mlp_triton.py); the variants timed: bench/GPU_NOTES.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

COLS, WARPS = 1024, 4


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, stride_in, stride_out, INTER: tl.constexpr, COLS: tl.constexpr):
    """Columns of one row: out = silu(gate) · up, gate and up the two halves of the row of gu."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * COLS + tl.arange(0, COLS)
    mask = c < INTER
    g = tl.load(gu_ptr + row * stride_in + c, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_in + INTER + c, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + c, (g * tl.sigmoid(g) * u).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor, cols: int = COLS, **settings: int) -> torch.Tensor:
    """silu(gate) · up for gate_up = [gate | up] (tokens, 2·inter), columns adjacent: (tokens, inter).
    `cols` and Triton's launch `settings` for the probe; the shipped ones by default."""
    if gate_up.stride(-1) != 1:
        gate_up = gate_up.contiguous()
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, inter, device=gate_up.device, dtype=gate_up.dtype)
    if rows:
        _silu_mul_kernel[(rows, triton.cdiv(inter, cols))](gate_up, out, gate_up.stride(0), out.stride(0),
                                                          INTER=inter, COLS=cols,
                                                          **(settings or {"num_warps": WARPS}))
    return out
