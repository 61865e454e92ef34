"""The benchmark's baseline strategies, over the same runner as Quail's.

- `independent` (naive): every request a full prompt of its own.
- `block_prefix` (prefix caching, as vLLM's automatic prefix caching): requests
  in arrival order; full 16-token blocks are cached by a hash of the prefix they
  end and reused by later batches; the cache holds pool slots, and gives the
  least recently used back when a pass needs them.
"""

from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict, deque
from typing import Sequence

import numpy as np
import torch

from quail.engine.kv.pool import KVPool
from quail.engine.kv.runs import KV, end_to_end
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.model_runner import ModelRunner
from quail.engine.runtime.requests import Request
from quail.engine.runtime.packing import Row, Share
from quail.engine.runtime.scheduler import PassScheduler, pass_tokens


def independent(scheduler: PassScheduler, runner: ModelRunner, requests: Sequence[Request],
                stats: Stats) -> list[torch.Tensor]:
    """Last hidden state per request, each prompt computed in full; passes packed by length."""
    job = _Independent(runner, requests, stats)
    scheduler.run(job)
    return job.hidden


class _Independent:
    """The naive baseline's work: the prompts longest first, as many to a pass as fit."""

    def __init__(self, runner: ModelRunner, requests: Sequence[Request], stats: Stats) -> None:
        self.runner, self.requests, self.stats = runner, requests, stats
        self.order = deque(sorted(range(len(requests)), key=lambda i: -len(requests[i])))
        tokens = sum(len(r) for r in requests)
        stats.planned_tokens += tokens
        self.pass_tokens = pass_tokens(tokens)
        self.hidden: list[torch.Tensor | None] = [None] * len(requests)
        self.members: list[int] = []

    def done(self) -> bool:
        return not self.order and not self.members

    def fill(self, fill: Share) -> None:
        while self.order and fill.admits(len(self.requests[self.order[0]])):
            i = self.order.popleft()
            fill.add(len(self.requests[i]))
            self.members.append(i)

    def rows(self, base: int) -> list[Row]:
        return [Row(self.requests[i].ids()) for i in self.members]

    def take(self, last: torch.Tensor, kept: list[KV | None]) -> None:
        for i, h in zip(self.members, last):
            self.hidden[i] = h
        self.members = []


class BlockPrefixCache:
    """KV of full token blocks keyed by a hash of everything up to each block's end.

    KV of full token blocks keyed by a hash of everything up to the block's end, in the pool's slots:
    bounded by the pool, the least recently used blocks going first when a pass needs slots (`make_room`)."""

    def __init__(self, block_size: int = 16) -> None:
        self.block_size = block_size
        self._blocks: OrderedDict[bytes, KV] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

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

    def make_room(self, pool: KVPool, count: int, held: set[bytes]) -> None:
        """Free slots for a pass that takes `count`: after the pool's own `evict` hook has had its turn
        (as `KVPool.take` gives it), drop least recently used blocks, but those in `held` (rows about to
        run continue them), until the pool has `count` free or no other block is left."""
        short = count - pool.free
        if short > 0 and pool.evict is not None:
            pool.evict(short)
        while (short := count - pool.free) > 0:
            victims = []
            for key in self._blocks:
                if key not in held:
                    victims.append(key)
                    if len(victims) * self.block_size >= short:
                        break
            if not victims:
                return
            for key in victims:
                del self._blocks[key]


def block_prefix(scheduler: PassScheduler, runner: ModelRunner, requests: Sequence[Request], stats: Stats,
                 cache: BlockPrefixCache | None = None) -> list[torch.Tensor]:
    """Last hidden state per request; arrival order, reusing cached blocks from earlier passes.

    A pass takes requests in order while their new tokens fit the budget;
    lookups see the cache as it was before the pass, as a real server's do.
    Every computed token is written to the pool (one scatter per layer) and its
    full blocks cached; before a pass, least recently used blocks no row of it
    continues give their slots back if the pool lacks them.
    """
    job = _BlockPrefix(runner, requests, stats, cache if cache is not None else BlockPrefixCache())
    scheduler.run(job)
    return job.hidden


class _BlockPrefix:
    """The prefix-caching baseline's work: each pass the next requests in arrival order, each after its
    longest run of cached blocks (the rows of a pass continuing the same blocks continue one run, read once
    for them all); the blocks it computed cached after the pass."""

    def __init__(self, runner: ModelRunner, requests: Sequence[Request], stats: Stats,
                 cache: BlockPrefixCache) -> None:
        self.runner, self.requests, self.stats, self.cache = runner, requests, stats, cache
        tokens = sum(len(r) for r in requests)
        stats.planned_tokens += tokens  # at most: cached blocks are not known ahead
        self.pass_tokens = pass_tokens(tokens)
        self.hidden: list[torch.Tensor | None] = [None] * len(requests)
        self.next = 0
        self.looked_up: tuple[int, list[bytes], int, Row] | None = None  # looked up, did not fit the last pass
        self.pending: list[tuple[int, list[bytes], int, Row]] = []
        self.pasts: dict[bytes, KV] = {}  # this pass's runs of cached blocks, by the key of their last block

    def done(self) -> bool:
        return self.next == len(self.requests) and self.looked_up is None and not self.pending

    def _look_up(self) -> tuple[int, list[bytes], int, Row]:
        i, ids = self.next, self.requests[self.next].ids()
        self.next += 1
        keys = self.cache.keys(ids)
        hit = self.cache.lookup(keys, (len(ids) - 1) // self.cache.block_size)
        fresh = ids[len(hit) * self.cache.block_size:]
        past = None
        if hit:
            past = self.pasts.get(keys[len(hit) - 1])
            if past is None:
                past = self.pasts[keys[len(hit) - 1]] = _joined(hit)
        return i, keys, len(hit), Row(fresh, past, keep=len(fresh))

    def fill(self, fill: Share) -> None:
        while self.looked_up is not None or self.next < len(self.requests):
            entry = self.looked_up or self._look_up()
            self.looked_up = None
            if not fill.admits(len(entry[3].ids)):
                self.looked_up = entry
                return
            fill.add(len(entry[3].ids))
            self.pending.append(entry)

    def rows(self, base: int) -> list[Row]:
        """The pass's rows, once the pool has slots for all they compute."""
        waiting = self.pending + ([self.looked_up] if self.looked_up is not None else [])
        held = {key for _, keys, hits, _ in waiting for key in keys[:hits]}
        self.cache.make_room(self.runner.pool, sum(len(row.ids) for *_, row in self.pending), held)
        return [row for *_, row in self.pending]

    def take(self, last: torch.Tensor, kept: list[KV | None]) -> None:
        size = self.cache.block_size
        for (i, keys, hits, _), h, kv in zip(self.pending, last, kept):
            self.hidden[i] = h
            for key, block in zip(keys[hits:], kv.blocks(size)):  # a short last block is no block: not stored
                self.cache.store(key, block)
        self.pending = []
        self.pasts = {}


def _joined(blocks: list[KV]) -> KV:
    """One run of the blocks end to end: their slots in one part where they all lie in one pool (always, but
    when the pool cannot hold a pass), else joined block by block."""
    joined = end_to_end(blocks)
    return KV((joined,)) if joined is not None else functools.reduce(KV.then, blocks)
