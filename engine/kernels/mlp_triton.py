"""Triton kernels of the SwiGLU block in bf16/fp16 (CUDA): silu(gate) · up from the joined gate/up projection.

- `silu_mul`: the product from the joined GEMM's output (tokens, 2·inter), one read and one write.
- `gate_up_silu`: the joined GEMM itself with the product in its epilogue: each program accumulates a
  gate tile and the up tile of the same columns, so the (tokens, 2·inter) output is never written.
Both compute in fp32 and round once; reference: F.silu(gate) · up in fp32 (tests/engine/test_mlp_triton.py).
Launch settings and the variants timed: bench/GPU_NOTES.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS, COLS = 8, 256  # silu_mul's block: rows × columns a program
GEMM = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, rows, stride_in, stride_out, INTER: tl.constexpr,
                     ROWS: tl.constexpr, COLS: tl.constexpr):
    """One block of rows × columns: out = silu(gate) · up, gate and up the two halves of a row of gu."""
    r = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    c = tl.program_id(1) * COLS + tl.arange(0, COLS)
    mask = (r < rows)[:, None] & (c < INTER)[None, :]
    gate_at = gu_ptr + r[:, None] * stride_in + c[None, :]
    g = tl.load(gate_at, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gate_at + INTER, mask=mask, other=0.0).to(tl.float32)
    out = g * tl.sigmoid(g) * u
    tl.store(out_ptr + r[:, None] * stride_out + c[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor, rows_block: int = ROWS, cols_block: int = COLS, **settings: int) -> torch.Tensor:
    """silu(gate) · up for gate_up = [gate | up] (tokens, 2·inter), columns adjacent; (tokens, inter).
    The block and Triton's launch `settings` for the probe; the shipped ones by default."""
    if gate_up.stride(-1) != 1:
        gate_up = gate_up.contiguous()
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, inter, device=gate_up.device, dtype=gate_up.dtype)
    if rows:
        grid = (triton.cdiv(rows, rows_block), triton.cdiv(inter, cols_block))
        _silu_mul_kernel[grid](gate_up, out, rows, gate_up.stride(0), out.stride(0), INTER=inter,
                               ROWS=rows_block, COLS=cols_block, **(settings or {"num_warps": 4}))
    return out


@triton.jit
def _gate_up_silu_kernel(x_ptr, w_ptr, out_ptr, rows, stride_x, stride_w, stride_out, K: tl.constexpr,
                         INTER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """One BLOCK_M × BLOCK_N tile of silu(x Wgᵀ) · (x Wuᵀ), Wg and Wu the two halves of w's rows.

    Tiles go in groups of GROUP_M row blocks per column block, so a group's weight tiles stay in L2."""
    pid = tl.program_id(0)
    row_blocks = tl.cdiv(rows, BLOCK_M)
    col_blocks: tl.constexpr = INTER // BLOCK_N
    group = pid // (GROUP_M * col_blocks)
    first = group * GROUP_M
    size = tl.minimum(row_blocks - first, GROUP_M)
    block_m = first + (pid % (GROUP_M * col_blocks)) % size
    block_n = (pid % (GROUP_M * col_blocks)) // size
    r = (block_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    n = (block_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    x_at = x_ptr + r[:, None] * stride_x + k[None, :]
    gate_at = w_ptr + n[None, :] * stride_w + k[:, None]
    up_at = gate_at + INTER * stride_w
    in_rows = (r < rows)[:, None]
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        a = tl.load(x_at, mask=in_rows, other=0.0)
        gate = tl.dot(a, tl.load(gate_at), gate)
        up = tl.dot(a, tl.load(up_at), up)
        x_at += BLOCK_K
        gate_at += BLOCK_K
        up_at += BLOCK_K
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + r[:, None] * stride_out + n[None, :], out.to(out_ptr.dtype.element_ty), mask=in_rows)


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor, **settings: int) -> torch.Tensor:
    """silu(x Wgᵀ) · (x Wuᵀ) for weight = [Wg; Wu] (2·inter, k) and x (tokens, k); (tokens, inter).
    `settings` override GEMM's tile sizes and launch settings (the probe's variants)."""
    s = {**GEMM, **settings}
    rows, k = x.shape
    inter = weight.shape[0] // 2
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(rows, inter, device=x.device, dtype=x.dtype)
    if rows:
        grid = (triton.cdiv(rows, s["BLOCK_M"]) * (inter // s["BLOCK_N"]),)
        _gate_up_silu_kernel[grid](x, weight, out, rows, x.stride(0), weight.stride(0), out.stride(0), K=k,
                                   INTER=inter, **s)
    return out


def fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether gate_up_silu's tiles divide the shapes (else the caller keeps the GEMM and silu_mul)."""
    return (weight.shape[0] // 2) % GEMM["BLOCK_N"] == 0 and x.shape[-1] % GEMM["BLOCK_K"] == 0 \
        and weight.stride(-1) == 1
