"""The resident tree: one radix tree over token ids indexing the KV in the device's pool, for all queries and time.

Every request continues from the longest prefix of its prompt found here,
whichever query computed it (`match`); every prompt a query computes goes in
(`insert`), its KV by reference (the pool's slots, no copy). When the pool needs
slots, the least valuable leaves go (kv/leaves.py; how: kv/tier_moves.py), those the plan has marked as
not needed again counting less (a filter's rejected documents: `demote`, or
`demote_later` once the query has its answers); never a
node a running query has pinned (its matched prefixes: they stay findable by
others while it runs). A node's parent becomes a leaf when its last child goes,
so a document outlives the questions asked of it. Queries running at once
share what neither has yet: a query `claim`s the documents it will compute,
and another that needs one of them waits for it instead of computing it too.

With a host tier (kv/host_tier.py), a leaf the pool has no room for moves to
pinned host memory instead of going (a leaf the plan demoted too: the query that
demoted it will not read it again, a dashboard's next refresh will), and comes
back when a request matches it, if copying is cheaper than computing: a node is
on the device or on the host, and a node on the device has its parent there.
The host tier drops its own least valuable leaves when it is full: to the disk
tier, where there is one, which also takes what the host tier cannot make room
for, and drops its own least valuable leaves in turn.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from quail.engine.kv.host_tier import HostTier
from quail.engine.kv.leaves import DISK, HOST, POOL, Leaves, Node
from quail.engine.kv.pool import KVPool
from quail.engine.kv.runs import KV
from quail.engine.kv.tier_moves import TierMoves
from quail.engine.kv.token_prefix import common_length


NOTED_MAX = 256  # prompts whose demotions are noted (demote_later) and not yet done, at most: past that, at once


@dataclass
class Match:
    """The longest resident prefix of a prompt.

    Its length, its KV (None when 0; of the part in the pool
    only, for a match that left the host tier's part where it is) and the node it ends in."""

    length: int
    kv: KV | None
    node: Node


@dataclass
class Counts:
    """What the tree has done since it began (the server's metrics read them)."""

    looked_up: int = 0
    hit: int = 0
    inserted: int = 0
    evicted: int = 0  # gone from the tree (from the pool, or from a lower tier)
    offloaded: int = 0  # moved from the pool to the host tier
    restored: int = 0  # copied back from the host tier
    to_disk: int = 0  # moved to the disk tier (from the host tier, or from the pool past a full host tier)
    from_disk: int = 0  # copied back from the disk tier


class ResidentTree(TierMoves):
    """The radix tree over the pool's runs, for all queries and time.

    The radix tree over the pool's runs. Thread-safe: queries match and insert from their threads and the
    scheduler's."""

    def __init__(self, pool: KVPool, host: HostTier | None = None, disk: HostTier | None = None) -> None:
        self.pool = pool
        self.host = host
        self.disk = disk if host is not None else None  # (behind the host tier)
        self.root = Node(np.empty(0, dtype=np.int32), None, None)
        self.tokens = 0  # tokens of the edges in the pool
        self.host_tokens = 0  # tokens of the edges in the host tier
        self.disk_tokens = 0  # tokens of the edges in the disk tier
        self.nodes = 0
        self.counts = Counts()
        # Leaves that may go: nodes in the pool with no child there, nodes in the host tier with no child in the
        # pool or there, nodes in the disk tier with no child.
        self.leaves = Leaves()
        self._moving: set[int] = set()  # the nodes (by id) a copy back is for, which stay where they are
        self._claims: dict[bytes, object] = {}
        self._noted: list[Callable[[], Iterable[tuple[np.ndarray, int]]]] = []  # demote_later's, not yet done
        self._noted_prompts = 0
        self._lock = threading.RLock()
        pool.evict = self.evict

    @property
    def cached_bytes(self) -> int:
        return self.tokens * self.pool.bytes_per_token

    def match(self, ids: np.ndarray, limit: int | None = None, counted: bool = True, fetch: bool = True,
              pin: bool = False, with_kv: bool = True, promised: bool = False) -> Match:
        """The longest resident prefix of `ids`, at most `limit` tokens (a request still computes its last
        token: its answer is read there); marks the path used. `counted`: in the hit rate. `fetch`: the
        part in the host tier is copied back into the pool (before the next pass; or not counted when
        recomputing is cheaper); else it counts in the length, and is copied back by the match that
        fetches it later (the caller pins the node meanwhile). `pin`: the node it ends in is pinned before
        anyone else may change the tree (`unpin` it). `with_kv`: the match holds the prefix's KV (else its
        kv is None: a caller that only plans, from its length and node, holds no slots for it). `promised`: the
        caller planned on this prefix (its node pinned since): a part a lower tier holds is copied back even
        where that tier would rather compute it again (the caller's positions count on every token)."""
        limit = len(ids) if limit is None else min(limit, len(ids))
        with self._lock:
            node, length = self.root, 0
            parts: list[KV] = []
            path: list[Node] = []
            while length < limit:
                child = node.children.get(int(ids[length]))
                if child is None or (child.kv is None and not (promised or child.host.tier.restores)):
                    break
                shared = common_length(child.ids, ids[length:limit])
                self.leaves.use(child)
                if child.kv is None:
                    if not fetch:
                        length += shared
                        node = child
                        if shared < len(child.ids):
                            break
                        continue
                    child, fetched = self._fetch(path, child, shared)
                    parts.append(fetched)
                elif with_kv:
                    parts.append(child.kv if shared == len(child.ids) else child.kv.slice(0, shared))
                length += shared
                node = child
                path.append(child)
                if shared < len(child.ids):
                    break
            self._touch(node)
            if pin:
                self.pin(node)
            if counted:
                self.counts.looked_up += limit
                self.counts.hit += length
        kv = None
        for part in parts:
            kv = part if kv is None else kv.then(part)
        return Match(length, kv, node)

    def resident_length(self, ids: np.ndarray) -> int:
        """How long a prefix of `ids` a match would find now (counting what it would copy back from the host
        tier), changing nothing."""
        return self.resident(ids)[0]

    def resident(self, ids: np.ndarray) -> tuple[int, float]:
        """How long a prefix of `ids` a match would find now, and what copying back the part of it in the
        lower tiers costs, in tokens computed (HostTier.copy_cost); changing nothing."""
        with self._lock:
            node, length, hosted = self.root, 0, 0.0
            while length < len(ids):
                child = node.children.get(int(ids[length]))
                if child is None or (child.kv is None and not child.host.tier.restores):
                    break
                shared = common_length(child.ids, ids[length:])
                length += shared
                hosted += shared * child.host.tier.copy_cost if child.kv is None else 0
                if shared < len(child.ids):
                    break
                node = child
            return length, hosted

    def _fetch(self, path: list[Node], child: Node, shared: int) -> tuple[Node, KV]:
        """`child` (in a lower tier, below the nodes of `path`) copied back, cut to its first `shared`
        tokens first: the node holding them, and their KV. Into the pool, where the node moves; into a pool
        of the caller's own when all the pool's slots are held (the node stays where it is). The room
        made for it is not made from the path or the child."""
        self.demote_noted()
        if shared < len(child.ids):
            child = self._split(child, shared)
        self._moving = {id(node) for node in (*path, child)}
        tier = child.host.tier
        try:
            kv = tier.restore(child.host)
        finally:
            self._moving = set()
        if tier is self.host:
            self.counts.restored += len(child.ids)
        else:
            self.counts.from_disk += len(child.ids)
        if kv.parts[0][0] is self.pool:
            self._to_pool(child, kv)
        return child, kv

    def _to_pool(self, node: Node, kv: KV) -> None:
        """A node of a lower tier whose KV is `kv` in the pool now (copied back, or computed again)."""
        self._count_lower(node, -1)
        node.kv, node.host = kv, None
        self.tokens += len(node.ids)
        node.parent.device_children += 1
        self._touch(node)

    def _count_lower(self, node: Node, sign: int) -> None:
        """Count a node's run into (+1) or out of (-1) the lower tier it lies in (`node.host.tier`): its
        tokens, and its parent's children in the host tier."""
        if node.host.tier is self.host:
            self.host_tokens += sign * len(node.ids)
            node.parent.host_children += sign
        else:
            self.disk_tokens += sign * len(node.ids)

    def settle(self) -> None:
        """Queue the copies back from the lower tiers that matches have promised (before a pass reads the
        pool)."""
        with self._lock:
            for tier in (self.host, self.disk):
                if tier is not None:
                    tier.settle()

    def count(self, looked_up: int, hit: int) -> None:
        """Count a lookup answered by an earlier match (the document prefix its requests share)."""
        with self._lock:
            self.counts.looked_up += looked_up
            self.counts.hit += hit

    def insert(self, ids: np.ndarray, kv: KV, start: int = 0, before: KV | None = None) -> None:
        """Index the prompt `ids` whose tokens from `start` on are the run `kv` (and those before it the run
        `before`): what the tree lacks of it is added, by reference."""
        def run(begin: int, end: int) -> KV | None:
            """The prompt's tokens [begin, end) (None: not given)."""
            if begin >= start:
                return KV(kv.parts) if (begin, end) == (start, len(ids)) else kv.slice(begin - start, end - start)
            if before is None:
                return None
            return before.slice(begin, min(end, start)).then(kv.slice(0, max(end - start, 0)))

        with self._lock:
            self.demote_noted()
            node, length = self.root, 0
            while length < len(ids):
                child = node.children.get(int(ids[length]))
                if child is None:
                    # A run of the tree's own, even when it is all of `kv`: the query's is freed when it is done.
                    tail = run(length, len(ids))
                    if not self._in_pool(tail) or (node.kv is None and node is not self.root):
                        return  # not given the KV before `start`, not in the pool, or its parent is in the host tier
                    leaf = Node(np.array(ids[length:]), tail, node, length)
                    self.leaves.use(leaf)
                    node.children[int(ids[length])] = leaf
                    node.device_children += 1
                    self.tokens += len(leaf.ids)
                    self.nodes += 1
                    self.counts.inserted += len(leaf.ids)
                    self._touch(leaf)
                    return
                shared = common_length(child.ids, ids[length:])
                if shared < len(child.ids):
                    child = self._split(child, shared)  # the part after `shared` is not used by this prompt
                self.leaves.use(child)
                if child.kv is None and (node.kv is not None or node is self.root):
                    self._promote(child, run(length, length + shared))
                length += shared
                node = child
            self._touch(node)

    def _in_pool(self, kv: KV | None) -> bool:
        """Whether a run lies in the tree's pool: a pass that found the pool full kept its KV in a pool of its
        own, which the tree does not index (evicting and moving to the host tier read the pool's slots)."""
        return kv is not None and all(pool is self.pool for pool, _ in kv.parts)

    def _promote(self, node: Node, kv: KV | None) -> None:
        """A node of a lower tier whose tokens a pass has just computed again: those (`kv`) are its KV now,
        if they lie in the pool."""
        if self._in_pool(kv):
            node.host.tier.free(node.host)
            self._to_pool(node, kv)

    def _split(self, child: Node, at: int) -> Node:
        """Cut the edge of `child` after `at` tokens; the new upper node."""
        upper = Node(child.ids[:at], None, child.parent, child.depth, value=child.value, uses=child.uses,
                     pins=child.pins, demoted=child.demoted)  # every pin through the child runs through its upper part
        if child.kv is not None:
            upper.kv, child.kv = child.kv.slice(0, at), child.kv.slice(at, len(child.ids))
            upper.device_children = 1
        else:
            upper.host, child.host = child.host.split(at)
            upper.host_children = int(child.host.tier is self.host)
        child.parent.children[int(child.ids[0])] = upper
        child.ids, child.depth, child.parent = child.ids[at:], child.depth + at, upper
        upper.children[int(child.ids[0])] = child
        self.nodes += 1
        return upper

    def pin(self, node: Node) -> None:
        """A running query will continue this node's prefix: it and the nodes above it stay in the tree until
        unpinned (in the pool, or moved to the host tier)."""
        with self._lock:
            while node is not self.root:
                node.pins += 1
                node = node.parent

    def unpin(self, node: Node) -> None:
        with self._lock:
            while node is not self.root:
                node.pins -= 1
                self._touch(node)
                node = node.parent

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

    def demote_later(self, demotions: Callable[[], Iterable[tuple[np.ndarray, int]]], prompts: int) -> None:
        """`demote` each (ids, after) that `demotions` gives (of at most `prompts` prompts), when the tree
        next changes (an insert, an eviction, a copy back from the host tier: `demote_noted`): the plan's
        word on what goes first is only read when leaves go, and the same nodes get it then. At once, on
        the caller's thread, past NOTED_MAX prompts noted: whoever changes the tree next does a bounded
        share of them (the device's owner loop, between two passes)."""
        with self._lock:
            self._noted.append(demotions)
            self._noted_prompts += prompts
            if self._noted_prompts > NOTED_MAX:
                self.demote_noted()

    def demote_noted(self) -> None:
        """Do the demotions `demote_later` noted."""
        with self._lock:
            noted, self._noted, self._noted_prompts = self._noted, [], 0
            for demotions in noted:
                for ids, after in demotions():
                    self.demote(ids, after)

    def _touch(self, node: Node) -> None:
        """Offer a leaf for eviction at its current priority (stale offers are skipped when popped)."""
        if node is self.root:
            return
        if node.kv is not None:
            if not node.device_children:
                self.leaves.offer(node, POOL)
        elif node.host.tier is self.host:
            if not node.host_children:
                self.leaves.offer(node, HOST)
        elif not node.children:
            self.leaves.offer(node, DISK)
        if len(self.leaves) > 4 * self.nodes + 1024:
            self._reoffer()  # mostly stale: one offer per leaf

    def _reoffer(self) -> None:
        """Offer every leaf once, afresh (`_touch` passes over the other nodes)."""
        self.leaves.clear()
        for node in self._all():
            self._touch(node)

    def _remove(self, node: Node) -> None:
        """Take the node and all below it out of the tree."""
        parent = node.parent
        del parent.children[int(node.ids[0])]
        if node.kv is not None:
            parent.device_children -= 1
        todo = [node]
        while todo:
            gone = todo.pop()
            todo.extend(gone.children.values())
            if gone.kv is not None:
                self.tokens -= len(gone.ids)
            else:
                gone.host.tier.free(gone.host)
                self._count_lower(gone, -1)  # (its parent's count too: the removed node's, or one going with it)
            self.nodes -= 1
            self.counts.evicted += len(gone.ids)
            gone.parent, gone.kv, gone.host = None, None, None
        self._touch(parent)

    def clear(self) -> None:
        """Forget every run no query has pinned (a benchmark measures each query from an empty tree)."""
        with self._lock:
            self.settle()  # the lower tiers' slots of copies owed are free once they are made
            leaves = [node for node in self._all() if not node.children and not node.pins]
            while leaves:
                parents = {id(leaf.parent): leaf.parent for leaf in leaves}
                for leaf in leaves:
                    self._remove(leaf)
                leaves = [p for p in parents.values() if p is not self.root and not p.children and not p.pins]
            self._reoffer()

    def _all(self) -> list[Node]:
        """Every node but the root."""
        out, todo = [], list(self.root.children.values())
        while todo:
            node = todo.pop()
            todo.extend(node.children.values())
            out.append(node)
        return out

