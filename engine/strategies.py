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
from .kv_cache import PrefixCache, document_prefix
from .radix import RadixNode, build, collapse, nodes
from .requests import Request
from .runner import ModelRunner, Row, pack
from .stats import Stats

Strategy = Callable[[ModelRunner, Sequence[Request], Stats], list[torch.Tensor]]


Item = tuple[RadixNode, "KV | None", "int | None"]  # a node, the resident KV it continues, its parent's row


def tree(runner: ModelRunner, requests: Sequence[Request], stats: Stats) -> list[torch.Tensor]:
    """Last hidden state per request, each distinct prefix computed once.

    Passes are filled from the front of a frontier that starts as the roots,
    longest first. A short node's children join its own pass right behind it
    (`_shares`: they attend to its keys there, copied before each of them);
    the children of other nodes, and those that did not fit, go to the front
    once the pass ran, grouped by parent (each parent's KV one run): depth
    first, so a parent's KV is dropped as soon as its last child ran. With the
    runner's prefix cache, requests whose document prefix is cached continue
    from it, and, where the runner retains them (a query asking the model again
    later), the document prefixes computed are stored there (kv_cache.py).
    """
    hidden: list[torch.Tensor | None] = [None] * len(requests)
    prefixes = [document_prefix(r) if runner.cache is not None else None for r in requests]
    roots = [(_chunked(node, runner.token_budget), kv) for node, kv in _roots(runner.cache, requests, prefixes)]
    frontier: deque[Item] = deque((node, kv, None) for node, kv in sorted(
        roots, key=lambda item: len(item[0]), reverse=True))
    stats.planned_tokens += sum(len(node) for root, *_ in frontier for node in [root, *nodes(root)])
    copies: dict[int, tuple[KV, KV]] = {}  # each run a stored prefix continues, and its copy for the cache
    while frontier:
        items, shared = _fill(runner, frontier)
        stored = [runner.retain and _stores(runner.cache, prefixes[node.rep], node) for node, *_ in items]
        rows = [_row(requests[c.rep], c, kv, parent, prefixes[c.rep][0] if store else 0)
                for (c, kv, parent), store in zip(items, stored)]
        last, kept = runner.forward(rows, stats)
        runs: list[KV | None] = []
        children: list[Item] = []
        for (node, kv, parent), row, h, new, store, joined in zip(items, rows, last, kept, stored, shared):
            for i in node.ends:
                hidden[i] = h
            base = runs[parent] if parent is not None else kv
            runs.append(None if new is None else new if base is None else base.then(new))
            if store:
                length, key = prefixes[node.rep]
                head = new if row.keep_tokens else new.slice(0, length - node.start).owned()
                runner.cache.put(key, head if base is None else _copied(copies, base).then(head))
            if node.children and not joined:
                children.extend((child, runs[-1], None) for child in sorted(node.children, key=len, reverse=True))
        while frontier and frontier[0][2] is not None:  # children that joined a pass they did not fit in
            node, _, parent = frontier.popleft()
            children.append((node, runs[parent], None))
        frontier.extendleft(reversed(children))
    return hidden


def _chunked(root: RadixNode, budget: int) -> RadixNode:
    """The tree with every edge longer than `budget` cut into a chain of edges of at most `budget` tokens
    (in place): a long prompt is computed in chunks, each continuing the KV of the one before, so no
    forward pass is longer than the budget (its time and memory bounded; cancellation between them)."""
    for node in [root, *nodes(root)]:
        while len(node) > budget:
            tail = RadixNode(node.start + budget, node.end, node.rep, node.children, node.ends)
            node.end, node.children, node.ends = node.start + budget, [tail], []
            node = tail
    return root


def _copied(copies: dict[int, tuple[KV, KV]], run: KV) -> KV:
    """The run copied once for all the cached prefixes that continue it: the cache never holds the
    KV a query keeps (the ledger counts that until the query is done with it)."""
    if id(run) not in copies:
        copies[id(run)] = (run, run.owned())
    return copies[id(run)][1]


def _fill(runner: ModelRunner, frontier: deque[Item]) -> tuple[list[Item], list[bool]]:
    """A pass's items from the frontier's front, and whether each one's children joined the frontier's
    front to follow it in the same pass (parent: its index in the pass)."""
    fill, items, shared, chain = runner.fill(), [], [], []
    while frontier and fill.admits(len(frontier[0][0])):
        node, kv, parent = frontier.popleft()
        fill.add(len(node))
        chain.append(0 if parent is None else chain[parent] + len(items[parent][0]))
        items.append((node, kv, parent))
        shared.append(bool(node.children) and _shares(chain[-1] + len(node), node.children))
        if shared[-1]:
            frontier.extendleft((child, kv, len(items) - 1) for child in sorted(node.children, key=len))
    return items, shared


def _shares(chain: int, children: list[RadixNode]) -> bool:
    """Whether children attend to a prefix of `chain` tokens computed in their own pass (copied before
    each of them, as a short resident run is: attention.Packed) rather than to its KV in a later pass:
    when the copies are no more than the tokens of the children and of all below them. A preamble
    joins the documents below it; an anchor does not join its partners' short questions."""
    return chain * len(children) <= sum(child.tokens_below() for child in children)


def _roots(cache: PrefixCache | None, requests: Sequence[Request],
           prefixes: list[tuple[int, bytes] | None]) -> list[tuple[RadixNode, KV | None]]:
    """The first nodes to compute, with the KV they continue: one radix tree over the requests whose
    document prefix is not cached, one per cached prefix over the requests continuing it."""
    if cache is None:
        return [(node, None) for node in collapse(build(requests)).children]
    groups: dict[bytes | None, list[int]] = {}
    hits: dict[bytes, KV] = {}  # fetched once: another query may evict an entry meanwhile
    for i, prefix in enumerate(prefixes):
        found = hits.get(prefix[1]) or cache.get(prefix[1]) if prefix is not None else None
        if found is not None:
            hits[prefix[1]] = found
        groups.setdefault(prefix[1] if found is not None else None, []).append(i)
    out: list[tuple[RadixNode, KV | None]] = []
    for key, members in groups.items():
        root = collapse(build([requests[i] for i in members]))
        for node in nodes(root):
            node.rep, node.ends = members[node.rep], [members[i] for i in node.ends]
        if key is None:
            out.extend((node, None) for node in root.children)
            continue
        cached, length = hits[key], prefixes[members[0]][0]
        todo = list(root.children)  # each continues the cached prefix: all its requests share it
        while todo:
            node = todo.pop()
            node.start = max(node.start, length)
            if len(node):
                out.append((node, cached))
            else:
                todo.extend(node.children)
    return out


def _row(request: Request, node: RadixNode, past: KV | None, parent: int | None, stored: int) -> Row:
    """The node's tokens after `past` and its parent's row; its KV kept for its children, or (a leaf
    that completes a document prefix of `stored` tokens to cache) just its part of that prefix, gathered
    with the pass's other such parts (the cache keeps it after a copy of what the row continues)."""
    keep_tokens = stored - node.start if stored and not node.children else 0
    return Row(request.tokens(node.start, node.end), past, bool(node.children), keep_tokens, parent)


def _stores(cache: PrefixCache | None, prefix: tuple[int, bytes] | None, node: RadixNode) -> bool:
    """Whether computing this node completes its requests' document prefix (then it is cached)."""
    return cache is not None and prefix is not None and node.start < prefix[0] <= node.end


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
    fill = runner.fill()

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
            fill = runner.fill()
        fill.add(len(row.ids))
        pending.append((i, keys, len(hit), row))
    if pending:
        flush()
    return hidden


STRATEGIES: dict[str, Strategy] = {"quail": tree, "naive": independent, "prefix": block_prefix}
