"""Triton kernels of the fp8 path (CUDA): per-token fp8 quantization, alone and after SiLU·mul, one program per row.

A row of up to ROW_BLOCK columns (Qwen3-4B's 9,728 of the MLP included) is
read once into registers, its largest magnitude found, then scaled and
stored. A longer row is read twice, in blocks: once for the largest
magnitude, once to scale and store. Reading every row twice (the first
version) left the second read to L2, which the ~2,000 rows in flight
outgrow: SiLU·mul + quantization ran at 55% of the memory roofline, Inductor's
kernel for it at 40%. References: fp8.quantize_rows and fp8.silu_mul_rows
(torch); fp8.py imports this module where Triton is installed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
BLOCK = 1024  # columns per step of a row longer than ROW_BLOCK
ROW_BLOCK = 16384  # a row of up to this many columns is held in registers


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
                     SILU: tl.constexpr, FP8_LIMIT: tl.constexpr, BLOCK: tl.constexpr, WHOLE: tl.constexpr):
    """One row: h = x (or silu(gate) · x with SILU), scale = max|h| / FP8_LIMIT, out = h / scale in e4m3.
    WHOLE: the row fits one BLOCK, read once; else read in BLOCK steps, twice."""
    row = tl.program_id(0).to(tl.int64)
    if WHOLE:
        cols = tl.arange(0, BLOCK)
        h = _values(x_ptr, gate_ptr, row, cols, cols < n_cols, stride_x, stride_gate, SILU)
        scale = tl.maximum(tl.max(tl.abs(h), axis=0), 1e-12) / FP8_LIMIT
        _store(out_ptr, row, cols, cols < n_cols, stride_out, h, scale, FP8_LIMIT)
    else:
        biggest = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            h = _values(x_ptr, gate_ptr, row, cols, cols < n_cols, stride_x, stride_gate, SILU)
            biggest = tl.maximum(biggest, tl.abs(h))
        scale = tl.maximum(tl.max(biggest, axis=0), 1e-12) / FP8_LIMIT
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            h = _values(x_ptr, gate_ptr, row, cols, cols < n_cols, stride_x, stride_gate, SILU)
            _store(out_ptr, row, cols, cols < n_cols, stride_out, h, scale, FP8_LIMIT)
    tl.store(scale_ptr + row, scale)


@triton.jit
def _store(out_ptr, row, cols, mask, stride_out, h, scale, FP8_LIMIT: tl.constexpr):
    """h / scale (IEEE division, as torch), clamped to the e4m3 range, stored at the row's `cols`."""
    q = tl.clamp(tl.math.div_rn(h, scale), -FP8_LIMIT, FP8_LIMIT)
    tl.store(out_ptr + row * stride_out + cols, q.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, gate: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.contiguous()
    gate = None if gate is None else gate.contiguous()
    rows, cols = x.shape
    out = torch.empty(rows, cols, device=x.device, dtype=FP8)
    scale = torch.empty(rows, 1, device=x.device, dtype=torch.float32)
    if rows:
        other = x if gate is None else gate
        whole = triton.next_power_of_2(cols) <= ROW_BLOCK
        block = triton.next_power_of_2(cols) if whole else BLOCK
        _quantize_kernel[(rows,)](x, other, out, scale, cols, x.stride(0), other.stride(0), out.stride(0),
                                  SILU=gate is not None, FP8_LIMIT=FP8_MAX, BLOCK=block, WHOLE=whole,
                                  num_warps=min(16, max(4, block // 1024)))
    return out, scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (rows, k) → fp8 values and one fp32 scale per row (rows, 1), as fp8.quantize_rows."""
    return _launch(x, None)


def silu_mul_rows(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """silu(gate) · up quantized per row, as fp8.silu_mul_rows, without writing the product."""
    return _launch(up, gate)
