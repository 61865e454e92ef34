"""Triton flash attention over packed rows (CUDA): each row's queries over its own keys, causal or not, with LSE.

One program takes one block of a row's queries in one head and walks that
row's keys in tiles with an online softmax (exp2, fp32 accumulators). Causal
masks align bottom-right (query i of a row with m keys and n queries sees keys
up to m − n + i), so a row's keys may start with copied ones (a preamble, a
chain). Tiles every query of the block sees skip the mask; the rest mask.
Grouped-query: head h reads kv head h // group. The host lists the query
blocks (attention.query_blocks: one tensor, so its alignment never makes Triton
compile another variant); reference: attention._matmuls.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 64


@triton.jit
def _tile(acc, m_i, l_i, q, k_ptrs, v_ptrs, n0, offs_m, offs_n, k_len, shift, qk_scale, stride_k, stride_v,
          MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """The block's running (acc, max, sum) after the key tile at n0 (log2 domain)."""
    cols = n0 + offs_n
    if MASKED:
        k = tl.load(k_ptrs + n0 * stride_k, mask=(cols < k_len)[None, :], other=0.0)
        v = tl.load(v_ptrs + n0 * stride_v, mask=(cols < k_len)[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs + n0 * stride_k)
        v = tl.load(v_ptrs + n0 * stride_v)
    s = tl.dot(q, k) * qk_scale
    if MASKED:
        allowed = cols[None, :] < k_len
        if CAUSAL:
            allowed = allowed & (cols[None, :] <= offs_m[:, None] + shift)
        s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, cu_q, cu_k, blocks,
                      stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                      stride_lt, qk_scale, GROUP: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    block = tl.program_id(0)
    head = tl.program_id(1)
    row = tl.load(blocks + 2 * block)
    m0 = tl.load(blocks + 2 * block + 1)
    q_begin = tl.load(cu_q + row)
    q_len = tl.load(cu_q + row + 1) - q_begin
    k_begin = tl.load(cu_k + row)
    k_len = tl.load(cu_k + row + 1) - k_begin
    shift = k_len - q_len
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    in_row = offs_m < q_len
    q_rows = (q_begin + offs_m).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :], mask=in_row[:, None],
                other=0.0)
    kv_head = head // GROUP
    k_rows = (k_begin + offs_n).to(tl.int64)
    k_ptrs = k_ptr + k_rows[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None]
    v_ptrs = v_ptr + k_rows[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :]
    if CAUSAL:
        seen_by_all = tl.minimum(shift + m0 + 1, k_len)
        end = tl.minimum(shift + m0 + BLOCK_M, k_len)
    else:
        seen_by_all = k_len
        end = k_len
    full = (seen_by_all // BLOCK_N) * BLOCK_N
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for n0 in range(0, full, BLOCK_N):
        acc, m_i, l_i = _tile(acc, m_i, l_i, q, k_ptrs, v_ptrs, n0, offs_m, offs_n, k_len, shift, qk_scale,
                              stride_kt, stride_vt, False, CAUSAL)
    for n0 in range(full, end, BLOCK_N):
        acc, m_i, l_i = _tile(acc, m_i, l_i, q, k_ptrs, v_ptrs, n0, offs_m, offs_n, k_len, shift, qk_scale,
                              stride_kt, stride_vt, True, CAUSAL)
    out = acc / l_i[:, None]
    tl.store(out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=in_row[:, None])
    tl.store(lse_ptr + q_rows * stride_lt + head, (m_i + tl.math.log2(l_i)) * 0.6931471805599453, mask=in_row)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                     blocks: torch.Tensor, block_m: int, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed q (tokens, heads, d), k/v (keys, kv_heads, d) of rows cut by the cumulative offsets cu_q and
    cu_k (rows + 1, int32) → output (tokens, heads, d) and natural-log LSE (tokens, heads) in fp32.
    blocks: (n, 2) int32, each query block's row and first query within it, block_m queries a block."""
    tokens, heads, dim = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(tokens, heads, device=q.device, dtype=torch.float32)
    if tokens == 0:
        return out, lse
    qk_scale = dim ** -0.5 / math.log(2)
    _attention_kernel[(blocks.shape[0], heads)](
        q, k, v, out, lse, cu_q, cu_k, blocks, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), out.stride(0), out.stride(1), lse.stride(0), qk_scale,
        GROUP=heads // k.shape[1], CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=BLOCK_N, HEAD_DIM=dim,
        num_warps=8 if block_m >= 128 else 4, num_stages=2)
    return out, lse
