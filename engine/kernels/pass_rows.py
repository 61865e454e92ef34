"""The layout of a pass's rows for attention: where each row's tokens sit, and what keys each continues.

- `Rows.build` lays out a pass's rows of new tokens after what they continue (resident KV, earlier rows of
  the pass): padded per bucket (padding_buckets.py), or for one varlen call (`Packed`: short runs and
  chains copied in before their rows); `runs` are the stretches of rows attended apart, over one run's keys.
- `query_blocks` cuts the queries into the Triton kernel's blocks (attention_triton.py).
- attention.py attends over this layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from quail.engine.kernels.padding_buckets import padded_shape, width_class
from quail.engine.kv.pool import KVPool, on_device_all
from quail.engine.kv.rows import copy_rows, gather_rows
from quail.engine.kv.runs import KV, end_to_end

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
