"""The resident tree: one radix tree over token ids indexing the KV in the device's pool, for all queries and time.

Every request continues from the longest prefix of its prompt found here,
whichever query computed it (`match`); every prompt a query computes goes in
(`insert`), its KV by reference (the pool's slots, no copy). When the pool needs
slots, leaves go: first those the plan has marked as not needed again (a
filter's rejected documents: `demote`), then the least recently used; never a
node a running query has pinned (its matched prefixes: they stay findable by
others while it runs). A node's parent becomes a leaf when its last child goes,
so a document outlives the questions asked of it. Queries running at once
share what neither has yet: a query `claim`s the documents it will compute,
and another that needs one of them waits for it instead of computing it too.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass, field

import numpy as np

from quail.engine.kv.pool import KVPool
from quail.engine.kv.runs import KV
from quail.engine.kv.token_prefix import common_length


@dataclass(eq=False)
class Node:
    """An edge of tokens after `depth` tokens, and its KV (root: none)."""

    ids: np.ndarray
    kv: KV | None
    parent: "Node | None"
    depth: int = 0
    children: dict[int, "Node"] = field(default_factory=dict)
    used: int = 0
    pins: int = 0
    demoted: bool = False


@dataclass
class Match:
    """The longest resident prefix of a prompt: its length, its KV (None when 0) and the node it ends in."""

    length: int
    kv: KV | None
    node: Node


@dataclass
class Counts:
    """What the tree has done since it began (the server's metrics read them)."""

    looked_up: int = 0
    hit: int = 0
    inserted: int = 0
    evicted: int = 0


class ResidentTree:
    """The radix tree over the pool's runs. Thread-safe: queries match and insert from their threads and the
    scheduler's."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.root = Node(np.empty(0, dtype=np.int32), None, None)
        self.tokens = 0  # tokens of every edge: what the tree holds
        self.nodes = 0
        self.counts = Counts()
        self._clock = itertools.count(1)
        self._heap: list[tuple[bool, int, int, Node]] = []  # evictable leaves: (not demoted, used, tie, node)
        self._tie = itertools.count()
        self._claims: dict[bytes, object] = {}
        self._lock = threading.RLock()
        pool.evict = self.evict

    @property
    def cached_bytes(self) -> int:
        return self.tokens * self.pool.bytes_per_token

    def match(self, ids: np.ndarray, limit: int | None = None, counted: bool = True) -> Match:
        """The longest resident prefix of `ids`, at most `limit` tokens (a request still computes its last
        token: its answer is read there); marks the path used. `counted`: in the hit rate."""
        limit = len(ids) if limit is None else min(limit, len(ids))
        with self._lock:
            node, length, now = self.root, 0, next(self._clock)
            parts: list[KV] = []
            while length < limit:
                child = node.children.get(int(ids[length]))
                if child is None:
                    break
                shared = common_length(child.ids, ids[length:limit])
                child.used = now
                if shared < len(child.ids):
                    parts.append(child.kv.slice(0, shared))
                    length += shared
                    node = child
                    break
                parts.append(child.kv)
                length += shared
                node = child
            self._touch(node)
            if counted:
                self.counts.looked_up += limit
                self.counts.hit += length
        kv = None
        for part in parts:
            kv = part if kv is None else kv.then(part)
        return Match(length, kv, node)

    def count(self, looked_up: int, hit: int) -> None:
        """Count a lookup answered by an earlier match (the document prefix its requests share)."""
        with self._lock:
            self.counts.looked_up += looked_up
            self.counts.hit += hit

    def insert(self, ids: np.ndarray, kv: KV, start: int = 0, before: KV | None = None) -> None:
        """Index the prompt `ids` whose tokens from `start` on are the run `kv` (and those before it the run
        `before`): what the tree lacks of it is added, by reference."""
        with self._lock:
            node, length, now = self.root, 0, next(self._clock)
            while length < len(ids):
                child = node.children.get(int(ids[length]))
                if child is None:
                    if length == start:
                        tail = KV(kv.parts)  # a run of the tree's own: the query's is freed when it is done
                    elif length > start:
                        tail = kv.slice(length - start, len(ids) - start)
                    else:
                        tail = before.slice(length, start).then(kv)
                    leaf = Node(np.array(ids[length:]), tail, node, length, used=now)
                    node.children[int(ids[length])] = leaf
                    self.tokens += len(leaf.ids)
                    self.nodes += 1
                    self.counts.inserted += len(leaf.ids)
                    self._touch(leaf)
                    return
                shared = common_length(child.ids, ids[length:])
                child.used = now
                if shared < len(child.ids):
                    child = self._split(child, shared)
                length += shared
                node = child
            self._touch(node)

    def _split(self, child: Node, at: int) -> Node:
        """Cut the edge of `child` after `at` tokens; the new upper node."""
        upper = Node(child.ids[:at], child.kv.slice(0, at), child.parent, child.depth, used=child.used,
                     demoted=child.demoted)
        child.parent.children[int(child.ids[0])] = upper
        child.ids, child.kv, child.depth, child.parent = child.ids[at:], child.kv.slice(at, len(child.ids)), \
            child.depth + at, upper
        upper.children[int(child.ids[0])] = child
        self.nodes += 1
        return upper

    def pin(self, node: Node) -> None:
        """A running query continues this node's prefix: it stays until unpinned."""
        with self._lock:
            node.pins += 1

    def unpin(self, node: Node) -> None:
        with self._lock:
            node.pins -= 1
            self._touch(node)

    def claim(self, key: bytes, owner: object) -> bool:
        """Whether `owner` computes the prefix named `key` (a document many running queries read): true when
        no other owner has claimed it, which it then has until `release`."""
        with self._lock:
            return self._claims.setdefault(key, owner) is owner

    def claimed(self, key: bytes, owner: object) -> bool:
        """Whether another owner than `owner` is computing the prefix named `key`."""
        with self._lock:
            return self._claims.get(key, owner) is not owner

    def release(self, keys: list[bytes], owner: object) -> None:
        """The owner's claims on these prefixes end (it has computed them, or stopped)."""
        with self._lock:
            for key in keys:
                if self._claims.get(key) is owner:
                    del self._claims[key]

    def demote(self, ids: np.ndarray, after: int) -> None:
        """The prompts continuing `ids` past its first `after` tokens go before any other when slots are
        needed (the plan will not ask about them again): the nodes on its path from there on, and all
        below its end."""
        with self._lock:
            node, length = self.root, 0
            while length < len(ids):
                node = node.children.get(int(ids[length]))
                if node is None:
                    return
                shared = common_length(node.ids, ids[length:])
                length += shared
                if node.depth + len(node.ids) > after:
                    node.demoted = True
                    self._touch(node)
                if shared < len(node.ids):
                    break
            if length < len(ids):
                return
            todo = list(node.children.values())
            while todo:
                below = todo.pop()
                below.demoted = True
                self._touch(below)
                todo.extend(below.children.values())

    def _touch(self, node: Node) -> None:
        """Offer a leaf for eviction at its current priority (stale offers are skipped when popped)."""
        if node is not self.root and not node.children:
            heapq.heappush(self._heap, (not node.demoted, node.used, next(self._tie), node))
            if len(self._heap) > 4 * self.nodes + 1024:  # mostly stale offers: keep one per leaf
                self._heap = [(not n.demoted, n.used, next(self._tie), n) for n in self._leaves()]
                heapq.heapify(self._heap)

    def evict(self, tokens: int) -> None:
        """Remove leaves, demoted first, then least recently used, until the pool has `tokens` more free
        slots or nothing is left to remove (a removed run's slots are free once no query holds them)."""
        with self._lock:
            target = self.pool.free + tokens
            while self._heap and self.pool.free < target:
                kept, used, _, node = heapq.heappop(self._heap)
                if node.parent is None or node.children or node.pins or (kept, used) != (not node.demoted,
                                                                                         node.used):
                    continue
                self._remove(node)

    def _remove(self, node: Node) -> None:
        parent = node.parent
        del parent.children[int(node.ids[0])]
        node.parent, node.kv = None, None
        self.tokens -= len(node.ids)
        self.nodes -= 1
        self.counts.evicted += len(node.ids)
        self._touch(parent)

    def clear(self) -> None:
        """Forget every unpinned run (a benchmark measures each query from an empty tree)."""
        with self._lock:
            self._heap = []
            for leaf in self._leaves():
                self._touch(leaf)
            while self._heap:
                node = heapq.heappop(self._heap)[3]
                if node.parent is not None and not node.children and not node.pins:
                    self._remove(node)
            for leaf in self._leaves():
                self._touch(leaf)

    def _leaves(self) -> list[Node]:
        out, todo = [], [self.root]
        while todo:
            node = todo.pop()
            todo.extend(node.children.values())
            if not node.children and node is not self.root:
                out.append(node)
        return out
