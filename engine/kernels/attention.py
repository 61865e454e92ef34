"""Attention of packed rows: causal over each row's own tokens, merged by log-sum-exp with what they continue.

Per layer, each row attends to its own tokens and to the keys it continues: a
resident run (a document or join anchor many rows continue, read once per call
for all of them, never copied per row) and its chain (earlier rows of the same
pass). Paths, every one equal to the fp32 reference (`attend`, `_matmuls`) to
float round-off:
- unpadded rows where Triton is installed: one kernel call per layer
  (`fused_packed`, attention_triton.py), runs and own tokens in one online
  softmax, rows continuing a long run cut into blocks across rows, runs in
  the pool read in place through their slot table (paged, a page a token);
- unpadded rows without Triton: one flash varlen call for own tokens, one for
  the runs, merged (`merge`);
- padded rows (buckets, padding_buckets.py): cuDNN per bucket in bf16/fp16,
  two matmuls for short rows and in fp32; on the CPU, its flash kernel. Rows
  of one token after runs of their own (decode steps) in fp32: their runs'
  keys gathered through the slot table and attended together as padded
  matmuls (`_one_query_runs`), not run by run.
The rows' layout is pass_rows.py's. Why these paths, with the measurements behind each: bench/GPU_NOTES.md.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from quail.engine.kernels.paged_decode import gathered
from quail.engine.kernels.padding_buckets import SMALL
from quail.engine.kernels.pass_rows import QUERY_BLOCK, Packed, Rows
from quail.engine.kv.rows import copy_rows

try:
    from quail.engine.kernels import attention_triton as attention_kernels  # Triton, with CUDA builds of torch
except ImportError:
    attention_kernels = None


def _fused(q: torch.Tensor) -> bool:
    return q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)


SCORES_PER_BLOCK = 1 << 24  # attention scores (fp32) `_matmuls` holds at once: 64 MiB, whatever the rows' length


def _matmuls(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention as two matmuls in the inputs' dtype, softmax and log-sum-exp in fp32.

    q (b, h, n, d), k/v (b, h_kv, m, d): the q heads of one kv head are stacked
    (h = h_kv · group, head i reads kv head i // group), so k and v are never
    repeated. Causal: bottom-right aligned (query i sees keys up to m − n + i).
    Queries go in blocks of at most SCORES_PER_BLOCK scores, so long rows never
    hold an n × m matrix.
    """
    b, h, n, d = q.shape
    m = k.shape[2]
    step = max(1, SCORES_PER_BLOCK // (b * h * m))
    if step < n:
        parts = [_matmuls_block(q[:, :, i:i + step], k, v, causal, m - n + i) for i in range(0, n, step)]
        return torch.cat([o for o, _ in parts], dim=2), torch.cat([lse for _, lse in parts], dim=2)
    return _matmuls_block(q, k, v, causal, m - n)


def _matmuls_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, offset: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """`_matmuls` of consecutive queries, the first of which sees keys up to `offset` when causal."""
    b, h, n, d = q.shape
    kv_heads, m = k.shape[1], k.shape[2]
    group = h // kv_heads
    scores = (q.reshape(b, kv_heads, group * n, d) @ k.transpose(-1, -2)).float() * d ** -0.5
    if causal:
        allowed = torch.ones(n, m, dtype=torch.bool, device=q.device).tril(offset).repeat(group, 1)
        scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, -1, keepdim=True)
    out = torch.exp(scores - lse).to(v.dtype) @ v
    return out.view(b, h, n, d), lse.view(b, h, n)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output (b, h, n, d) and log-sum-exp (b, h, n) in fp32; k/v may have fewer heads (GQA).

    On the CPU, its flash kernel (the one scaled_dot_product_attention runs for
    rows that continue nothing, so rows after a past are no slower), unless
    causal over more keys than queries; cuDNN for bf16/fp16 on CUDA, unless
    every row is short; else two matmuls (fp32: the reference, exact to round-off).
    """
    if q.device.type == "cpu" and (not causal or q.shape[2] == k.shape[2]):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal,
                                                                         scale=q.shape[-1] ** -0.5)
    if not _fused(q) or max(q.shape[2], k.shape[2]) <= SMALL:
        return _matmuls(q, k, v, causal)
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False, scale=q.shape[-1] ** -0.5)[:2]
    return out, lse.view(q.shape[:3])


def own_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: Packed, layer: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's causal attention to its own tokens (after its copied run and chain, if any), all rows
    in one flash varlen call (where Triton is absent: else `fused_packed`): (n, h, d), (n, h). Causal
    masks align bottom-right: token i of a row after p copied keys sees keys up to p + i."""
    keys, values = packed.keys(k, v, layer)
    out, lse = torch.ops.aten._flash_attention_forward(
        q, keys, values, packed.offsets, packed.key_offsets, packed.longest, packed.longest_keys, 0.0, True,
        False, scale=q.shape[-1] ** -0.5)[:2]
    return out, lse.transpose(0, 1)


def _run_keys(rows: Rows, k: torch.Tensor, v: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values of the runs attended apart in `layer`, laid end to end in run order (one gather
    from the pool when they all lie there)."""
    if rows.run_slots is not None:
        pool, slots = rows.run_slots
        return pool.keys[layer].index_select(0, slots), pool.values[layer].index_select(0, slots)
    pieces = [piece for *_, run in rows.runs for piece in run.pieces(k, v, layer)]
    return torch.cat([piece[0] for piece in pieces]), torch.cat([piece[1] for piece in pieces])


def _kernel_runs(rows: Rows, k: torch.Tensor, v: torch.Tensor, layer: int
                 ) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor | None]:
    """The runs as the Triton kernel reads them in `layer`: the pool's keys and values and the runs' slot
    table when they all lie in one pool (read in place), else their keys laid end to end (no table)."""
    if rows.run_slots is not None:
        pool, slots = rows.run_slots
        return (pool.keys[layer], pool.values[layer], rows.run_offsets[1]), slots
    return (*_run_keys(rows, k, v, layer), rows.run_offsets[1]), None


def fused_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: Rows, layer: int,
                 into: torch.Tensor | None = None) -> torch.Tensor:
    """Unpadded rows by one call of the Triton kernel: each row's own tokens (after its copied run and
    chain) causally and, for the rows continuing a run attended apart, that run's keys first, in the
    same online softmax (nothing merged afterwards): (n, h, d), written into `into` where given."""
    packed = rows.packed
    keys, values = packed.keys(k, v, layer)
    runs, slots = _kernel_runs(rows, k, v, layer) if rows.runs else (None, None)
    return attention_kernels.packed_attention(q, packed.blocks, QUERY_BLOCK,
                                              (keys, values, packed.offsets, packed.key_offsets, packed.rows),
                                              runs, slots, out=into)[0]


def over_runs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: Rows, layer: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of the tokens in rows.past_index to their runs' keys (non-causal): (n, h, d), (n, h).

    k and v: the pass's own (a run's chain is theirs). One run of padded rows:
    one cuDNN call. Several, or unpadded rows: one call of the Triton kernel
    (flash varlen without Triton) over the runs' keys laid end to end. fp32:
    the reference, run by run.
    """
    def packed(t: torch.Tensor) -> torch.Tensor:  # (n, h, d) → (1, h, n, d) view
        return t.transpose(0, 1)[None]

    if not _fused(q) or (len(rows.runs) == 1 and rows.packed is None):
        found: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        alone = [i for i, (first, end, _) in enumerate(rows.runs) if end - first == 1]
        if len(alone) > 1 and rows.run_slots is not None:
            found.update(zip(alone, _one_query_runs(q, rows, layer, alone)))
        for r, (first, end, run) in enumerate(rows.runs):
            if r in found:
                continue
            pieces = run.pieces(k, v, layer)
            keys, values = (torch.cat([piece[i] for piece in pieces]) for i in (0, 1))
            out, lse = attend(packed(q[first:end]), packed(keys), packed(values), causal=False)
            found[r] = (out[0].transpose(0, 1), lse[0].transpose(0, 1))
        return torch.cat([found[i][0] for i in range(len(rows.runs))]), \
            torch.cat([found[i][1] for i in range(len(rows.runs))])
    queries = q.index_select(0, rows.past_index)
    if attention_kernels is not None:
        runs, slots = _kernel_runs(rows, k, v, layer)
        return attention_kernels.packed_attention(queries, rows.run_blocks, QUERY_BLOCK, runs=runs, run_slots=slots)
    keys, values = _run_keys(rows, k, v, layer)
    cu_q, cu_k = rows.run_offsets
    out, lse = torch.ops.aten._flash_attention_forward(
        queries, keys, values, cu_q, cu_k, max(e - a for a, e, _ in rows.runs),
        max(len(run) for *_, run in rows.runs), 0.0, False, False, scale=q.shape[-1] ** -0.5)[:2]
    return out, lse.transpose(0, 1)


def _one_query_runs(q: torch.Tensor, rows: Rows, layer: int, alone: list[int]
                    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The runs `alone` (of one query each: decode steps), attended together as padded matmuls, their keys
    gathered from the pool through a slot table of the runs (paged_decode.gathered): each run's (1, h, d)
    output and (1, h) log-sum-exp, as `attend` gives them to round-off."""
    pool, slots = rows.run_slots
    cumulative = rows.run_offsets[1].long()
    picked = torch.tensor(alone, device=q.device)
    firsts, lengths = cumulative[picked], (cumulative[1:] - cumulative[:-1])[picked]
    queries = q.index_select(0, torch.tensor([rows.runs[i][0] for i in alone], device=q.device))
    span = torch.arange(int(lengths.max()), device=q.device)
    table = slots[firsts[:, None] + torch.minimum(span, lengths[:, None] - 1)]
    out, lse = gathered(queries, pool.keys[layer], pool.values[layer], table, lengths)
    return [(out[r:r + 1], lse[r:r + 1]) for r in range(len(alone))]


def merge(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor) -> torch.Tensor:
    """Two partial attentions over disjoint key sets as one: o (n, h, d), lse (n, h)."""
    lse = torch.logaddexp(lse1, lse2)
    return ((torch.exp(lse1 - lse)[..., None] * o1.float() + torch.exp(lse2 - lse)[..., None] * o2.float())
            .to(o1.dtype))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: Rows, layer: int,
              merger: Callable[..., torch.Tensor] = merge, into: torch.Tensor | None = None) -> torch.Tensor:
    """Packed q (tokens, heads, d) and k/v (tokens, kv_heads, d) → output (tokens, heads, d).

    Each row attends causally to its own tokens (one kernel call per padding
    bucket, or one varlen call for them all) and to every key it continues in
    `layer`: a resident run's, and its chain's (earlier rows of the pass, whose
    keys are in k and v); `merger` is `merge` or a compiled (fused) version of it.
    Unpadded rows with Triton: all of it in one kernel call (`fused_packed`), which writes the output
    into `into` where given (q's shape: a captured pass's buffer); the other ways ignore `into`.
    """
    if rows.packed is not None and attention_kernels is not None:
        return fused_packed(q, k, v, rows, layer, into)
    if rows.packed is not None:
        out, lse = own_varlen(q, k, v, rows.packed, layer)
        if not rows.runs:
            return out
    else:
        blocks = zip(rows.pad(q), rows.pad(k), rows.pad(v))
        if not rows.runs and not _fused(q):
            return rows.unpad([F.scaled_dot_product_attention(*b, is_causal=True, enable_gqa=True) for b in blocks])
        own = [attend(*b, causal=True) for b in blocks]
        out = rows.unpad([o for o, _ in own])
        if not rows.runs:
            return out
        lse = rows.unpad([l[..., None] for _, l in own])[..., 0]
    index = rows.past_index
    lse = lse.index_select(0, index)
    past, past_lse = over_runs(q, k, v, rows, layer)
    return copy_rows(out, index, merger(out.index_select(0, index), lse, past, past_lse))
