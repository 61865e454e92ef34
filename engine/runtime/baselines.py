"""The benchmark's baseline strategies, over the same runner as Quail's.

- `independent` (naive): every request a full prompt of its own.
- `block_prefix` (prefix caching, as vLLM's automatic prefix caching): requests
  in arrival order; full 16-token blocks are cached by a hash of the prefix they
  end and reused by later batches.
"""

from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict
from typing import Sequence

import numpy as np
import torch

from quail.engine.kv.runs import KV
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.model_runner import ModelRunner
from quail.engine.runtime.requests import Request
from quail.engine.runtime.scheduler import Row, new_pass, pack


def independent(runner: ModelRunner, requests: Sequence[Request], stats: Stats) -> list[torch.Tensor]:
    """Last hidden state per request, each prompt computed in full; batches packed by length."""
    order = sorted(range(len(requests)), key=lambda i: -len(requests[i]))
    stats.planned_tokens += sum(len(r) for r in requests)
    hidden: list[torch.Tensor | None] = [None] * len(requests)
    for batch in pack([len(requests[i]) for i in order], runner.token_budget, runner.model.padded_attention):
        members = [order[i] for i in batch]
        last, _ = runner.forward([Row(requests[i].ids()) for i in members], stats)
        for i, h in zip(members, last):
            hidden[i] = h
    return hidden


class BlockPrefixCache:
    """KV of full token blocks keyed by a hash of everything up to the block's end (LRU-bounded)."""

    def __init__(self, block_size: int = 16, max_blocks: int = 1 << 14) -> None:
        self.block_size = block_size
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[bytes, KV] = OrderedDict()

    def keys(self, ids: np.ndarray) -> list[bytes]:
        """Chained hashes of the full blocks of ids."""
        out, parent = [], b""
        for start in range(0, len(ids) - self.block_size + 1, self.block_size):
            parent = hashlib.blake2b(parent + ids[start : start + self.block_size].tobytes(), digest_size=16).digest()
            out.append(parent)
        return out

    def lookup(self, keys: list[bytes], limit: int) -> list[KV]:
        """KV of the longest run of cached leading blocks, at most `limit` blocks."""
        found = []
        for key in keys[:limit]:
            block = self._blocks.get(key)
            if block is None:
                break
            self._blocks.move_to_end(key)
            found.append(block)
        return found

    def store(self, key: bytes, kv: KV) -> None:
        self._blocks[key] = kv
        self._blocks.move_to_end(key)
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)


def block_prefix(runner: ModelRunner, requests: Sequence[Request], stats: Stats,
                 cache: BlockPrefixCache | None = None) -> list[torch.Tensor]:
    """Last hidden state per request; arrival order, reusing cached blocks from earlier batches.

    A batch takes requests in order while its new tokens fit the budget;
    lookups see the cache as it was before the batch, as a real server's do.
    """
    cache = cache or BlockPrefixCache()
    stats.planned_tokens += sum(len(r) for r in requests)  # at most: cached blocks are not known ahead
    hidden: list[torch.Tensor | None] = [None] * len(requests)
    size = cache.block_size
    pending: list[tuple[int, list[bytes], int, Row]] = []
    fill = new_pass(runner)

    def flush() -> None:
        last, kept = runner.forward([row for *_, row in pending], stats)
        for (i, keys, hits, _), h, kv in zip(pending, last, kept):
            hidden[i] = h
            new = kv.owned()
            for b in range(hits, len(keys)):
                cache.store(keys[b], new.slice((b - hits) * size, (b - hits + 1) * size))
        pending.clear()

    for i, request in enumerate(requests):
        ids = request.ids()
        keys = cache.keys(ids)
        hit = cache.lookup(keys, (len(ids) - 1) // size)
        row = Row(ids[len(hit) * size :], functools.reduce(KV.then, hit) if hit else None, keep_kv=True)
        if not fill.admits(len(row.ids)):
            flush()
            fill = new_pass(runner)
        fill.add(len(row.ids))
        pending.append((i, keys, len(hit), row))
    if pending:
        flush()
    return hidden
