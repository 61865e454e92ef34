"""Triton decode attention (CUDA): one program per sequence and kv head, its group's queries over the keys its slot table names.

Each program loads the table row's slots a tile at a time, gathers those
keys and values of its kv head from the pool (a slot's kv heads are
contiguous, so a tile is BLOCK_N rows of head_dim elements), and runs an
online softmax in exp2 with fp32 accumulators. The group's queries (heads
sharing the kv head) are padded to a tile of 16 rows for `tl.dot`: decode
is bound by reading the keys, which each program reads once. The loop ends
at the sequence's length, read on the device, so a captured CUDA graph
serves every length its table is wide enough for. Reference:
paged_decode.gathered.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 64


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, lengths_ptr, out_ptr, stride_qb, stride_qh, stride_kt, stride_kh,
                   stride_vt, stride_vh, stride_tb, stride_ob, stride_oh, qk_scale, GROUP: tl.constexpr,
                   BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    offs_g = tl.arange(0, BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    in_group = offs_g < GROUP
    heads = kv_head * GROUP + tl.where(in_group, offs_g, 0)
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :])
    length = tl.load(lengths_ptr + b)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    k_base = k_ptr + kv_head * stride_kh
    v_base = v_ptr + kv_head * stride_vh
    for n0 in range(0, length, BLOCK_N):
        cols = n0 + offs_n
        inside = cols < length
        at = tl.load(table_ptr + b * stride_tb + cols, mask=inside, other=0).to(tl.int64)
        k = tl.load(k_base + at[None, :] * stride_kt + offs_d[:, None], mask=inside[None, :], other=0.0)
        v = tl.load(v_base + at[:, None] * stride_vt + offs_d[None, :], mask=inside[:, None], other=0.0)
        s = tl.where(inside[None, :], tl.dot(q, k) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile holds a key (the loop ends at the length)
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=in_group[:, None])


def paged_decode(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, table: torch.Tensor,
                 lengths: torch.Tensor, block_n: int = BLOCK_N, **launch: int) -> torch.Tensor:
    """As paged_decode.paged_decode; block_n (keys a step) and launch (num_warps, num_stages) override the
    shipped settings: a probe's."""
    sequences, heads, dim = q.shape
    kv_heads = keys.shape[1]
    out = torch.empty_like(q)
    if sequences == 0:
        return out
    group = heads // kv_heads
    _decode_kernel[(sequences, kv_heads)](
        q, keys, values, table, lengths, out, q.stride(0), q.stride(1), keys.stride(0), keys.stride(1),
        values.stride(0), values.stride(1), table.stride(0), out.stride(0), out.stride(1),
        dim ** -0.5 / math.log(2), GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n,
        HEAD_DIM=dim, **({"num_warps": 4, "num_stages": 3} | launch))
    return out
