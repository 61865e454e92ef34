"""How a set of requests becomes forward passes.

- `tree` (Quail): a radix tree over the prompts; every shared prefix worth
  keeping (radix.worth_keeping) is computed once, its KV kept exactly until the
  requests below it are done, and rows that continue the same prefix are
  batched together.
- `independent` (the naive baseline): every request a full prompt of its own.
- `block_prefix` (the prefix-caching baseline, as vLLM's automatic prefix
  caching): requests in arrival order; full 16-token blocks are cached by a
  hash of the prefix they end and reused by later batches.
"""

from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict, deque
from typing import Callable, Sequence

import numpy as np
import torch

from .kv import KV
from .radix import RadixNode, build, collapse, nodes
from .requests import Request
from .runner import Fill, ModelRunner, Row, pack
from .stats import Stats

Strategy = Callable[[ModelRunner, Sequence[Request], Stats], list[torch.Tensor]]


def tree(runner: ModelRunner, requests: Sequence[Request], stats: Stats) -> list[torch.Tensor]:
    """Last hidden state per request, each distinct prefix computed once.

    Passes are filled from the front of a frontier that starts as the roots,
    longest first. The children of a pass's nodes go to the front, grouped by
    parent (each parent's KV one run): depth first, so a parent's KV is
    dropped as soon as its last child ran, and a pass mixes one level's
    continuations with the next nodes waiting behind them.
    """
    hidden: list[torch.Tensor | None] = [None] * len(requests)
    root = collapse(build(requests))
    stats.planned_tokens += sum(len(node) for node in nodes(root))
    frontier: deque[tuple[RadixNode, KV | None]] = deque(
        (node, None) for node in sorted(root.children, key=len, reverse=True))
    while frontier:
        fill, items = Fill(runner.token_budget), []
        while frontier and fill.admits(len(frontier[0][0])):
            items.append(frontier.popleft())
            fill.add(len(items[-1][0]))
        rows = [Row(requests[c.rep].tokens(c.start, c.end), kv, keep_kv=bool(c.children)) for c, kv in items]
        last, kept = runner.forward(rows, stats)
        children = []
        for (node, kv), h, new in zip(items, last, kept):
            for i in node.ends:
                hidden[i] = h
            if node.children:
                run = new if kv is None else kv.then(new)
                children.extend((child, run) for child in sorted(node.children, key=len, reverse=True))
        frontier.extendleft(reversed(children))
    return hidden


def independent(runner: ModelRunner, requests: Sequence[Request], stats: Stats) -> list[torch.Tensor]:
    """Last hidden state per request, each prompt computed in full; batches packed by length."""
    order = sorted(range(len(requests)), key=lambda i: -len(requests[i]))
    stats.planned_tokens += sum(len(r) for r in requests)
    hidden: list[torch.Tensor | None] = [None] * len(requests)
    for batch in pack([len(requests[i]) for i in order], runner.token_budget):
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
    fill = Fill(runner.token_budget)

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
            fill = Fill(runner.token_budget)
        fill.add(len(row.ids))
        pending.append((i, keys, len(hit), row))
    if pending:
        flush()
    return hidden


STRATEGIES: dict[str, Strategy] = {"quail": tree, "naive": independent, "prefix": block_prefix}
