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
Why these paths, with the measurements behind each: bench/GPU_NOTES.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from quail.engine.kernels.paged_decode import gathered
from quail.engine.kernels.padding_buckets import SMALL, padded_shape, width_class
from quail.engine.kv.pool import KVPool, on_device_all
from quail.engine.kv.rows import copy_rows, gather_rows
from quail.engine.kv.runs import KV, end_to_end

try:
    from quail.engine.kernels import attention_triton as attention_kernels  # Triton, with CUDA builds of torch
except ImportError:
    attention_kernels = None


QUERY_BLOCK = 64  # queries a program of the Triton kernel takes: of one row, or of one run's rows (attention_triton.py)


def query_blocks(spans: list[tuple[int, int, int]], block: int) -> np.ndarray:
    """(blocks, 3) int32 for the Triton kernel: each span of queries (first, end, the run they continue
    or −1) cut in order into blocks of at most `block`: each block's first query, count and run."""
    table = np.asarray(spans, dtype=np.int64).reshape(-1, 3)
    counts = -(-(table[:, 1] - table[:, 0]) // block)
    span = np.repeat(np.arange(len(table)), counts)
    firsts = table[span, 0] + block * (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
    return np.stack([firsts, np.minimum(block, table[span, 1] - firsts), table[span, 2]], axis=1).astype(np.int32)


def _buckets(lengths: list[int], starts: np.ndarray) -> tuple[list[tuple[int, int, int]], np.ndarray]:
    """Each padding bucket's (offset, rows, width) in one flat buffer, and each packed token's place there."""
    members: dict[int, list[int]] = {}
    for b, n in enumerate(lengths):
        members.setdefault(width_class(n), []).append(b)
    buckets, base, offset = [], np.zeros(len(lengths), dtype=np.int64), 0
    for _, rows in sorted(members.items()):
        count, width = padded_shape(len(rows), max(lengths[b] for b in rows))
        base[rows] = offset + width * np.arange(len(rows))
        buckets.append((offset, count, width))
        offset += count * width
    within = np.arange(starts[-1]) - np.repeat(starts[:-1], lengths)
    return buckets, np.repeat(base, lengths) + within


@dataclass(eq=False)
class Before:
    """What a stretch of rows continues: resident KV and/or earlier tokens of the pass.

    What a stretch of rows continues: resident KV (`past`) and/or tokens earlier in the same pass
    (`chain`: their packed indices on the device), in that order."""

    past: KV | None
    chain: torch.Tensor | None = None

    def __len__(self) -> int:
        return (len(self.past) if self.past is not None else 0) + (len(self.chain) if self.chain is not None else 0)

    def pieces(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Its keys and values in `layer`, piece by piece (k, v: the pass's own, for the chain)."""
        out = [self.past.layer(layer)] if self.past else []
        if self.chain is not None:
            out.append((k.index_select(0, self.chain), v.index_select(0, self.chain)))
        return out


@dataclass
class Packed:
    """Rows laid out for one flash varlen call (no padding), with short runs before them copied in.

    A resident run no longer than its rows' own tokens together (a preamble
    before documents) is cheaper to copy before each of its rows than to attend
    separately and merge; so are the tokens of earlier rows of the pass that a
    row continues (its chain, short by the strategy's choice). Each row's keys
    are [copied run, chain, own tokens]. offsets and key_offsets: (rows + 1)
    cumulative query and key counts on the device, longest and longest_keys
    their largest steps, key_total the last; rows: each packed query's row;
    blocks: the query blocks of the Triton kernel (query_blocks): a row's own,
    or, for the rows continuing a run attended apart (`runs`, in order),
    blocks across them; own_index: where the packed
    tokens' keys go in the key buffer (None: the buffer is the packed keys
    themselves); inlined: each copied run and how many rows it precedes;
    inline_index: where those copies go, in that order; chain_from and
    chain_to: which packed tokens' keys are copied where as chains. Where the
    pass writes its tokens' keys into the pool holding the copied runs before
    each layer's attention (`Rows.build`'s `written`), key_slots names every
    key of the buffer by its slot in that pool (`key_pool`): one gather a
    layer, however many runs are copied, and no other copy.
    """

    offsets: torch.Tensor
    key_offsets: torch.Tensor
    longest: int
    longest_keys: int
    key_total: int
    rows: torch.Tensor
    blocks: torch.Tensor
    own_index: torch.Tensor | None = None
    inlined: list[tuple[KV, int]] = field(default_factory=list)
    inline_index: torch.Tensor | None = None
    chain_from: torch.Tensor | None = None
    chain_to: torch.Tensor | None = None
    key_slots: torch.Tensor | None = None
    key_pool: KVPool | None = None

    def keys(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value buffers of the varlen call: each row's copied run and chain (if any), then its own."""
        if self.key_slots is not None:
            return (gather_rows(self.key_pool.keys[layer], self.key_slots),
                    gather_rows(self.key_pool.values[layer], self.key_slots))
        if self.own_index is None:
            return k, v
        runs = [(run.layer(layer), count) for run, count in self.inlined]  # a chained run's pieces joined once
        out = []
        for own, pick in ((k, 0), (v, 1)):
            buffer = own.new_empty(self.key_total, *own.shape[1:])
            copy_rows(buffer, self.own_index, own)
            if runs:
                copies = torch.cat([kv[pick].repeat(count, 1, 1) for kv, count in runs])
                copy_rows(buffer, self.inline_index, copies)
            if self.chain_from is not None:
                copy_rows(buffer, self.chain_to, own.index_select(0, self.chain_from))
            out.append(buffer)
        return out[0], out[1]


def _chains(starts: np.ndarray, parents: list[int | None]) -> list[np.ndarray]:
    """Each row's chain: the packed tokens of the earlier rows it continues, first ancestor first."""
    chains: list[np.ndarray] = []
    for b, parent in enumerate(parents):
        if parent is None:
            chains.append(np.zeros(0, dtype=np.int64))
            continue
        if not 0 <= parent < b:
            raise ValueError(f"row {b} continues row {parent}: a row continues an earlier row of its pass")
        chains.append(np.concatenate([chains[parent], np.arange(starts[parent], starts[parent + 1])]))
    return chains


PACKED_ARRAYS = ("offsets", "key_offsets", "rows", "blocks", "own_index", "inline_index", "chain_from", "chain_to",
                 "key_slots")


def _packed(lengths: list[int], starts: np.ndarray, row_runs: list[tuple[int, int, KV]], chains: list[np.ndarray],
            written: tuple[KVPool, np.ndarray] | None = None
            ) -> tuple[dict[str, np.ndarray | None], dict, list[tuple[int, int, KV]]]:
    """The varlen layout of the rows: Packed's index arrays (PACKED_ARRAYS, on the host) and its other
    fields; and the runs (first row, end row, KV) left to attend separately. `written`: as `Rows.build`'s."""
    lengths_a = np.asarray(lengths, dtype=np.int64)
    copied = np.zeros(len(lengths), dtype=np.int64)
    chained = np.array([len(c) for c in chains], dtype=np.int64)
    inlined, kept = [], []
    for first, end, run in row_runs:
        if len(run) * (end - first) <= lengths_a[first:end].sum():
            copied[first:end] = len(run)
            inlined.append((first, end, run))
        else:
            kept.append((first, end, run))
    before = copied + chained
    key_offsets = np.concatenate([[0], np.cumsum(before + lengths_a)])
    apart = np.zeros(len(lengths), dtype=bool)
    for first, end, _ in kept:
        apart[first:end] = True
    spans = [(starts[b], starts[b + 1], -1) for b in np.flatnonzero(~apart)]
    spans += [(starts[first], starts[end], i) for i, (first, end, _) in enumerate(kept)]
    arrays: dict[str, np.ndarray | None] = dict.fromkeys(PACKED_ARRAYS)
    arrays.update(offsets=starts.astype(np.int32), key_offsets=key_offsets.astype(np.int32),
                  rows=np.repeat(np.arange(len(lengths), dtype=np.int32), lengths_a),
                  blocks=query_blocks(spans, QUERY_BLOCK))
    other = {"longest": int(lengths_a.max()), "longest_keys": int((before + lengths_a).max()),
             "key_total": int(key_offsets[-1])}
    if not before.any():
        return arrays, other, kept
    if written is not None and all(pool is written[0] for *_, run in inlined for pool, _ in run.parts):
        arrays["key_slots"] = _key_slots(written[1], starts, inlined, chains)
        other["key_pool"] = written[0]
        return arrays, other, kept
    arrays["own_index"] = np.repeat(key_offsets[:-1] + before - starts[:-1], lengths_a) + np.arange(starts[-1])
    if inlined:
        arrays["inline_index"] = np.concatenate([key_offsets[b] + np.arange(len(run)) for first, end, run in inlined
                                                 for b in range(first, end)])
        other["inlined"] = [(run, end - first) for first, end, run in inlined]
    if chained.any():
        arrays["chain_from"] = np.concatenate(chains)
        arrays["chain_to"] = np.concatenate([key_offsets[b] + copied[b] + np.arange(n) for b, n in enumerate(chained)])
    return arrays, other, kept


def _key_slots(slots: np.ndarray, starts: np.ndarray, inlined: list[tuple[int, int, KV]], chains: list[np.ndarray]
               ) -> np.ndarray:
    """Every row's keys, [copied run, chain, own], as slots of one pool: the copied run's own slots, and for
    the pass's tokens (chains and own) the slots `slots` they are written to (one per packed token)."""
    copied: dict[int, np.ndarray] = {}
    for first, end, run in inlined:
        run_slots = np.concatenate([part for _, part in run.parts])
        copied.update(dict.fromkeys(range(first, end), run_slots))
    none = np.zeros(0, dtype=slots.dtype)
    return np.concatenate([piece for b, chain in enumerate(chains)
                           for piece in (copied.get(b, none), slots[chain], slots[starts[b]:starts[b + 1]])]
                          ).astype(np.int64)


def _stretches(keys: list[tuple[int, ...]]) -> list[tuple[int, int]]:
    """(first row, end row) of each stretch of consecutive rows with equal keys."""
    out: list[tuple[int, int]] = []
    for b, key in enumerate(keys):
        if out and keys[out[-1][0]] == key:
            out[-1] = (out[-1][0], b + 1)
        else:
            out.append((b, b + 1))
    return out


def _run_arrays(starts: np.ndarray, runs: list[tuple[int, int, KV | None, np.ndarray | None]]
                ) -> tuple[KVPool | None, list[np.ndarray | None]]:
    """For the runs attended apart, each (first row, end row, past, chain): the pool holding their pasts end
    to end (None: not in one pool, or a run follows a chain), and on the host Rows' past_index, run_offsets
    (query and key counts), run_blocks and the slots of run_slots (None where there is none)."""
    if not runs:
        return None, [None] * 5
    past_index = np.concatenate([np.arange(starts[first], starts[end]) for first, end, _, _ in runs])
    keys = [(0 if past is None else len(past)) + (0 if chain is None else len(chain)) for _, _, past, chain in runs]
    sizes = np.array([[0, 0]] + [[starts[end] - starts[first], n] for (first, end, *_), n in zip(runs, keys)],
                     dtype=np.int32).cumsum(0, dtype=np.int32)
    blocks = query_blocks([(sizes[i, 0], sizes[i + 1, 0], i) for i in range(len(runs))], QUERY_BLOCK)
    slots = None if any(chain is not None for *_, chain in runs) else end_to_end([past for _, _, past, _ in runs])
    arrays = [past_index, sizes[:, 0].copy(), sizes[:, 1].copy(), blocks]
    return (None, [*arrays, None]) if slots is None else (slots[0], [*arrays, slots[1].astype(np.int64)])


@dataclass
class Rows:
    """Where each row's new tokens sit in the packed batch, and what they continue.

    starts: (rows + 1) offsets into the packed tokens; context: how many tokens
    come before each row's own (its resident KV, then its chain: the tokens of
    the earlier rows of the pass it continues). For attention, rows are
    padded per bucket (width_class), not to the pass's longest row: buckets
    holds (offset, rows, width) of each bucket's (rows × width) block in one
    flat padded buffer, and pad_index (tokens,) the flat position of each packed
    token there. runs: (first token, end token, Before) for each stretch of
    consecutive rows that continue the same keys attended separately;
    past_index: the packed tokens in such stretches, in run order (None
    when no row is); run_offsets: (cumulative query tokens, cumulative keys)
    of those runs laid end to end, for a varlen kernel, and run_blocks their
    query blocks (query_blocks); run_slots: the pool and the slots of those
    runs end to end when they all lie in one pool and follow no chain (the
    Triton kernel reads them in place through that table; elsewhere one
    gather per layer). Unpadded: no buckets;
    `packed` lays the rows out for one varlen call, short runs and chains copied in.
    """

    lengths: list[int]
    starts: list[int]
    context: list[int]
    buckets: list[tuple[int, int, int]]
    pad_index: torch.Tensor | None
    runs: list[tuple[int, int, Before]]
    past_index: torch.Tensor | None = None
    run_offsets: tuple[torch.Tensor, torch.Tensor] | None = None
    run_blocks: torch.Tensor | None = None
    run_slots: tuple[KVPool, torch.Tensor] | None = None
    packed: Packed | None = None

    @classmethod
    def build(cls, lengths: list[int], pasts: list[KV | None], device: torch.device, padded: bool = True,
              parents: list[int | None] | None = None, written: tuple[KVPool, np.ndarray] | None = None) -> "Rows":
        """The layout of rows of `lengths` new tokens after `pasts` and, where `parents` names one, after
        that earlier row of the pass (and what it continues: its past is theirs); padded: per bucket, else
        for one varlen call. `written`: the pool and slots (one per packed token) where the pass writes
        its tokens' keys and values in each layer before that layer's attention, if it does: the varlen
        layout then reads the rows' keys from that pool where it holds every copied run (Packed)."""
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        parents = parents or [None] * len(lengths)
        if any(p is not None and pasts[b] is not pasts[p] for b, p in enumerate(parents)):
            raise ValueError("a row continuing an earlier row of its pass continues that row's past too")
        chains = _chains(starts, parents)
        context = [(len(past) if past is not None else 0) + len(chain) for past, chain in zip(pasts, chains)]
        buckets, pad_index, packed, other = [], None, dict.fromkeys(PACKED_ARRAYS), None
        if padded:
            buckets, pad_index = _buckets(lengths, starts)
            stretches = _stretches([(id(past), parent) for past, parent in zip(pasts, parents)])
            runs = [(first, end, pasts[first], chains[first] if len(chains[first]) else None)
                    for first, end in stretches if context[first]]
        else:
            stretches = _stretches([(id(past),) for past in pasts])
            row_runs = [(first, end, pasts[first]) for first, end in stretches if pasts[first] is not None]
            packed, other, kept = _packed(lengths, starts, row_runs, chains, written)
            runs = [(first, end, run, None) for first, end, run in kept]
        pool, run_arrays = _run_arrays(starts, runs)
        moved = iter(on_device_all(device, [pad_index, *packed.values(), *run_arrays, *(c for *_, c in runs)]))
        pad_index = next(moved)
        packed = {name: next(moved) for name in packed}
        past_index, queries, keys, blocks, slots = (next(moved) for _ in run_arrays)
        runs = [(int(starts[first]), int(starts[end]), Before(past, next(moved))) for first, end, past, _ in runs]
        layout = cls(lengths, starts.tolist(), context, buckets, pad_index, runs,
                     packed=None if other is None else Packed(**packed, **other))
        if runs:
            layout.past_index, layout.run_offsets, layout.run_blocks = past_index, (queries, keys), blocks
            layout.run_slots = None if pool is None else (pool, slots)
        return layout

    def pad(self, x: torch.Tensor) -> list[torch.Tensor]:
        """(tokens, heads, d) packed → per bucket (rows, heads, width, d), right-padded with zeros."""
        offset, rows, width = self.buckets[-1]
        out = x.new_zeros(offset + rows * width, *x.shape[1:])
        copy_rows(out, self.pad_index, x)
        return [out[o : o + r * w].view(r, w, *x.shape[1:]).transpose(1, 2) for o, r, w in self.buckets]

    def unpad(self, blocks: list[torch.Tensor]) -> torch.Tensor:
        """Per bucket (rows, heads, width, ...) → (tokens, heads, ...)."""
        flat = [x.transpose(1, 2).reshape(-1, *x.shape[1:2], *x.shape[3:]) for x in blocks]
        return (flat[0] if len(flat) == 1 else torch.cat(flat)).index_select(0, self.pad_index)


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
