"""Triton kernels of the fp8 path (CUDA): per-token fp8 quantization, alone and after SiLU·mul, one program per row.

Each program reads its row twice: once for the row's largest magnitude, once
to scale and store it (the second read meant to find the row in L2; a row is
at most ~40 KB). References: fp8.quantize_rows and fp8.silu_mul_rows (torch),
equal to these kernels bit for bit (tests/test_fp8_kernels.py); fp8.py imports
this module where Triton is installed. Launch settings and the variants tried:
bench/GPU_NOTES.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
BLOCK = 2048  # columns per step, with 8 warps (SiLU·mul) or 4 (bench/GPU_NOTES.md, "fp8 kernels tried")


@triton.jit
def _values(x_ptr, gate_ptr, row, cols, mask, stride_x, stride_gate, SILU: tl.constexpr):
    """The row's values at `cols` in fp32: x, or silu(gate) · x with SILU."""
    h = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if SILU:
        g = tl.load(gate_ptr + row * stride_gate + cols, mask=mask, other=0.0).to(tl.float32)
        h = g * tl.sigmoid(g) * h
    return h


@triton.jit
def _quantize_kernel(x_ptr, gate_ptr, out_ptr, scale_ptr, n_cols, stride_x, stride_gate, stride_out,
                     SILU: tl.constexpr, FP8_LIMIT: tl.constexpr, BLOCK: tl.constexpr):
    """One row: h = x (or silu(gate) · x with SILU), scale = max|h| / FP8_LIMIT, out = h / scale in e4m3."""
    row = tl.program_id(0).to(tl.int64)
    biggest = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        h = _values(x_ptr, gate_ptr, row, cols, cols < n_cols, stride_x, stride_gate, SILU)
        biggest = tl.maximum(biggest, tl.abs(h))
    scale = tl.maximum(tl.max(biggest, axis=0), 1e-12) / FP8_LIMIT
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        h = _values(x_ptr, gate_ptr, row, cols, cols < n_cols, stride_x, stride_gate, SILU)
        q = tl.clamp(tl.math.div_rn(h, scale), -FP8_LIMIT, FP8_LIMIT)  # IEEE division, as torch
        tl.store(out_ptr + row * stride_out + cols, q.to(out_ptr.dtype.element_ty), mask=cols < n_cols)
    tl.store(scale_ptr + row, scale)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel reads it: rows at any stride, columns adjacent (a half of a joined GEMM's output is)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _launch(x: torch.Tensor, gate: torch.Tensor | None, block: int = BLOCK, **settings: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel over x (after SiLU·mul with gate); `block` and Triton's launch `settings` (num_warps,
    num_stages) for the launch probe, the shipped ones by default."""
    x = _rows(x)
    gate = None if gate is None else _rows(gate)
    rows, cols = x.shape
    out = torch.empty(rows, cols, device=x.device, dtype=FP8)
    scale = torch.empty(rows, 1, device=x.device, dtype=torch.float32)
    if rows:
        other = x if gate is None else gate
        _quantize_kernel[(rows,)](x, other, out, scale, cols, x.stride(0), other.stride(0), out.stride(0),
                                  SILU=gate is not None, FP8_LIMIT=FP8_MAX, BLOCK=block,
                                  **(settings or {"num_warps": 4 if gate is None else 8}))
    return out, scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (rows, k) → fp8 values and one fp32 scale per row (rows, 1), as fp8.quantize_rows."""
    return _launch(x, None)


def silu_mul_rows(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """silu(gate) · up quantized per row, as fp8.silu_mul_rows, without writing the product."""
    return _launch(up, gate)
