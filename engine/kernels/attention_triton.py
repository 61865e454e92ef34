"""Triton flash attention over packed rows (CUDA): each query over a shared run's keys and its own row's, with LSE.

One program takes one block of consecutive queries in one head. A block's
queries may continue a run (resident keys every one of them sees: a join's
anchor), attended first; then each query attends to its own row's keys,
causally, aligned bottom-right (query i of a row with m keys and n queries
sees keys up to m − n + i), so a row's keys may start with copied ones (a
preamble, a chain). A block may span several short rows of one run (a join's
partners): each query sees only its own row's keys (masked), so the run's
keys are read once for all of them and nothing is merged afterwards. The
online softmax runs in exp2 with fp32 accumulators; tiles every query of the
block sees skip the mask. Grouped-query: head h reads kv head h // group. The
host lists the blocks (pass_rows.query_blocks: one tensor, so its alignment
never makes Triton compile another variant); reference: attention._matmuls.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 64


@triton.jit
def _tile(acc, m_i, l_i, q, k_base, v_base, n0, offs_n, offs_d, k_end, lo, hi, qk_scale, stride_k, stride_v,
          slots, MASKED: tl.constexpr, OWN_ROWS: tl.constexpr, PAGED: tl.constexpr):
    """The block's running (acc, max, sum) after the key tile at n0 (log2 domain); k_base and v_base
    point at key 0 of the head. Masked: keys from k_end on are absent and, for OWN_ROWS, query j sees
    keys lo[j]..hi[j] only. PAGED: key n lies at row slots[n] (a pool's slot table), else at row n."""
    cols = n0 + offs_n
    if PAGED:
        if MASKED:
            at = tl.load(slots + cols, mask=cols < k_end, other=0).to(tl.int64)
        else:
            at = tl.load(slots + cols).to(tl.int64)
    else:
        at = cols.to(tl.int64)
    k_ptrs = k_base + at[None, :] * stride_k + offs_d[:, None]
    v_ptrs = v_base + at[:, None] * stride_v + offs_d[None, :]
    if MASKED:
        k = tl.load(k_ptrs, mask=(cols < k_end)[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=(cols < k_end)[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    s = tl.dot(q, k) * qk_scale
    if MASKED:
        allowed = cols[None, :] < k_end
        if OWN_ROWS:
            allowed = allowed & (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None])
        s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a query that has seen no key yet
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, rk_ptr, rv_ptr, r_slots, out_ptr, lse_ptr, cu_q, cu_k, q_rows, cu_r, blocks,
                      stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_rkt, stride_rkh,
                      stride_rvt, stride_rvh, stride_ot, stride_oh, stride_lt, qk_scale, GROUP: tl.constexpr,
                      OWN: tl.constexpr, PAGED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      HEAD_DIM: tl.constexpr):
    block = tl.program_id(0)
    head = tl.program_id(1)
    q0 = tl.load(blocks + 3 * block)
    count = tl.load(blocks + 3 * block + 1)
    run = tl.load(blocks + 3 * block + 2)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    valid = offs_m < count
    queries = q0 + tl.where(valid, offs_m, 0)  # a short block's spare lanes repeat its first query
    q = tl.load(q_ptr + queries.to(tl.int64)[:, None] * stride_qt + head * stride_qh + offs_d[None, :])
    kv_head = head // GROUP
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if run >= 0:
        r_lo = tl.load(cu_r + run)
        r_end = tl.load(cu_r + run + 1)
        rk_base = rk_ptr + kv_head * stride_rkh
        rv_base = rv_ptr + kv_head * stride_rvh
        r_full = r_lo + ((r_end - r_lo) // BLOCK_N) * BLOCK_N
        for n0 in range(r_lo, r_full, BLOCK_N):
            acc, m_i, l_i = _tile(acc, m_i, l_i, q, rk_base, rv_base, n0, offs_n, offs_d, r_end, m_i, m_i, qk_scale,
                                  stride_rkt, stride_rvt, r_slots, False, False, PAGED)
        for n0 in range(r_full, r_end, BLOCK_N):
            acc, m_i, l_i = _tile(acc, m_i, l_i, q, rk_base, rv_base, n0, offs_n, offs_d, r_end, m_i, m_i, qk_scale,
                                  stride_rkt, stride_rvt, r_slots, True, False, PAGED)
    if OWN:
        row = tl.load(q_rows + queries)
        lo = tl.load(cu_k + row)
        hi = tl.load(cu_k + row + 1) - tl.load(cu_q + row + 1) + queries
        k_lo = tl.min(lo, 0)
        k_end = tl.max(hi, 0) + 1
        seen_by_all = tl.min(hi, 0) + 1
        n_full = tl.where(tl.max(lo, 0) == k_lo, tl.maximum(seen_by_all - k_lo, 0) // BLOCK_N, 0)
        k_base = k_ptr + kv_head * stride_kh
        v_base = v_ptr + kv_head * stride_vh
        for n0 in range(k_lo, k_lo + n_full * BLOCK_N, BLOCK_N):
            acc, m_i, l_i = _tile(acc, m_i, l_i, q, k_base, v_base, n0, offs_n, offs_d, k_end, lo, hi, qk_scale,
                                  stride_kt, stride_vt, cu_k, False, True, False)
        for n0 in range(k_lo + n_full * BLOCK_N, k_end, BLOCK_N):
            acc, m_i, l_i = _tile(acc, m_i, l_i, q, k_base, v_base, n0, offs_n, offs_d, k_end, lo, hi, qk_scale,
                                  stride_kt, stride_vt, cu_k, True, True, False)
    out = acc / l_i[:, None]
    rows_out = queries.to(tl.int64)
    tl.store(out_ptr + rows_out[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=valid[:, None])
    tl.store(lse_ptr + rows_out * stride_lt + head, (m_i + tl.math.log2(l_i)) * 0.6931471805599453, mask=valid)


def packed_attention(q: torch.Tensor, blocks: torch.Tensor, block_m: int,
                     own: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                     runs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                     run_slots: torch.Tensor | None = None,
                     block_n: int = BLOCK_N, out: torch.Tensor | None = None,
                     **launch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed q (tokens, heads, d) → output (tokens, heads, d) and natural-log LSE (tokens, heads), fp32.

    blocks: (n, 3) int32, each block's first query, its number of queries (≤ block_m) and the run its
    queries continue (−1: none). own: (k, v, cu_q, cu_k, q_rows): each row's keys and values (keys,
    kv_heads, d), the rows' cumulative query and key counts (rows + 1) and each query's row (tokens,),
    attended causally; None: queries see their runs only. runs: (k, v, cu_r): the runs' keys and values
    laid end to end and their cumulative key counts (runs + 1), attended in full; with run_slots (the
    runs' keys end to end, each an index into k and v of runs), k and v are a pool's (slots, kv_heads, d)
    and the kernel reads each key through that slot table, nothing gathered first (three pipeline stages
    hide the table's extra load: bench/GPU_NOTES.md). block_n (keys a step)
    and launch (Triton's num_warps, num_stages) override the shipped settings: a probe's. out: where the
    output is written (q's shape, any strides; a captured pass's buffer), else a new tensor."""
    tokens, heads, dim = q.shape
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty(tokens, heads, device=q.device, dtype=torch.float32)
    if tokens == 0:
        return out, lse
    k, v, cu_q, cu_k, q_rows = own if own is not None else (q, q, blocks, blocks, blocks)
    rk, rv, cu_r = runs if runs is not None else (k, v, blocks)
    _attention_kernel[(blocks.shape[0], heads)](
        q, k, v, rk, rv, run_slots if run_slots is not None else blocks, out, lse, cu_q, cu_k, q_rows, cu_r, blocks,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), rk.stride(0), rk.stride(1),
        rv.stride(0), rv.stride(1), out.stride(0), out.stride(1), lse.stride(0), dim ** -0.5 / math.log(2),
        GROUP=heads // rk.shape[1],
        OWN=own is not None, PAGED=run_slots is not None, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=dim,
        **({"num_warps": 8 if block_m >= 128 else 4, "num_stages": 2 if run_slots is None else 3} | launch))
    return out, lse
