"""How the resident tree makes room: the pool's least valuable leaves down the tiers, or out of the tree.

- `evict` (the pool's callback when it needs slots) takes leaves of the pool, least valuable first (Leaves),
  at least MOVE_TOKENS at a time where there is a host tier; without one they leave the tree.
- With lower tiers, the leaves move in groups the host tier can hold: to the host tier, its own leaves worth
  no more than the group's most valuable making room (to the disk tier, or out of the tree); what the host
  tier cannot take goes to the disk tier; what neither can take leaves the tree (a pinned node stays).
- A part of ResidentTree (kv/resident.py), in a file of its own: it reads and changes the tree's state
  under the tree's lock, as the tree's other methods do.
"""

from __future__ import annotations

from quail.engine.kv.host_tier import HostRun, HostTier
from quail.engine.kv.leaves import DISK, HOST, POOL, Node

MOVE_TOKENS = 2048  # the fewest tokens of leaves moved to the host tier at once


class TierMoves:
    """ResidentTree's moves down the tiers (see the module); the tree's other state is its own."""

    def evict(self, tokens: int) -> None:
        """Make `tokens` more slots free in the pool, or as many as can be: the least valuable leaves go
        (Leaves: demoted ones counting less); to the host tier when there is one, else out of the tree (a
        run's slots are free once no query holds them). Leaves move to the host tier
        MOVE_TOKENS (or a sixteenth of a smaller pool) at a time at least: each move is a gather per layer,
        whatever its size (more at once would push out documents a scan still needs: each copied back then
        moves as many out)."""
        with self._lock:
            self.demote_noted()
            if self.host is not None:
                tokens = max(tokens, min(MOVE_TOKENS, self.pool.slots // 16))
            free = self.pool.free
            target = free + tokens
            while free < target:
                moving: list[Node] = []
                taken: set[int] = set()
                size = 0  # tokens of the leaves taken: free once no query holds them (counted again after)
                while free + size < target:
                    node = self.leaves.pop(POOL)
                    if node is None:
                        break
                    if node.kv is None or node.device_children or id(node) in self._moving or id(node) in taken:
                        continue  # (a leaf offered twice at one priority is taken once)
                    if self.host is not None:
                        moving.append(node)  # (a pinned node may move to the host tier, not leave the tree)
                        taken.add(id(node))
                        size += len(node.ids)
                    elif not node.pins:
                        size += len(node.ids)
                        self.leaves.gone(node, POOL)
                        self._remove(node)
                if moving:
                    self._offload(moving)
                if not size:
                    return  # no leaf left to go (their parents are offered as the leaves below them go)
                free = self.pool.free

    def _offload(self, nodes: list[Node]) -> None:
        """Move these leaves' KV (least valuable first) down, in groups the host tier can hold: to the host
        tier, its leaves worth no more than a group's most valuable making room (to the disk tier); then to
        the disk tier; else out of the tree."""
        group: list[Node] = []
        size = 0
        for node in nodes:
            if group and size + len(node.ids) > self.host.slots:
                self._offload_group(group)
                group, size = [], 0
            group.append(node)
            size += len(node.ids)
        self._offload_group(group)

    def _offload_group(self, nodes: list[Node]) -> None:
        """Move the leaves to the host tier, those it has no room for to the disk tier, those neither has room
        for out of the tree (but a pinned one, which stays in the pool)."""
        self.settle()  # copies back still owed are written before any slot of a lower tier is read or reused
        for tier in (self.host, self.disk):
            if tier is None or not nodes:
                continue
            self._make_room(tier, sum(len(node.ids) for node in nodes), max(node.value for node in nodes))
            homes = tier.offload([node.kv for node in nodes])
            for node, home in zip(nodes, homes):
                if home is not None:
                    self._from_pool(node, home)
            nodes = [node for node, home in zip(nodes, homes) if home is None]
        for node in nodes:
            self.leaves.gone(node, POOL)
            if not node.pins:
                self._remove(node)

    def _from_pool(self, node: Node, home: HostRun) -> None:
        """A leaf of the pool whose KV is `home` in a lower tier now."""
        self.leaves.gone(node, POOL)
        node.kv, node.host = None, home
        self.tokens -= len(node.ids)
        node.parent.device_children -= 1
        self._count_lower(node, +1)
        if home.tier is self.host:
            self.counts.offloaded += len(node.ids)
        else:
            self.counts.to_disk += len(node.ids)
        self._touch(node)
        self._touch(node.parent)

    def _make_room(self, tier: HostTier, room: int, best: float) -> None:
        """Free `room` slots of a lower tier, as far as its leaves worth no more than `best` go: the host
        tier's to the disk tier (or out of the tree), the disk tier's out of the tree."""
        kind = HOST if tier is self.host else DISK
        while tier.slots - tier.used < room:
            node = self.leaves.pop(kind, at_most=best)
            if node is None:
                return
            if node.kv is not None or node.host.tier is not tier or id(node) in self._moving:
                continue
            if kind == HOST and not node.host_children:
                self._sink(node)
            elif kind == DISK and not node.children and not node.pins:
                self.leaves.gone(node, DISK)
                self._remove(node)

    def _sink(self, node: Node) -> None:
        """A leaf of the host tier that must make room: to the disk tier (its leaves worth no more making
        room), else out of the tree (a pinned one stays)."""
        if self.disk is not None:
            self._make_room(self.disk, len(node.ids), node.value)
            home = self.host.move(node.host, self.disk)
            if home is not None:
                self.leaves.gone(node, HOST)
                self._count_lower(node, -1)
                node.host = home
                self._count_lower(node, +1)
                self.counts.to_disk += len(node.ids)
                self._touch(node)
                self._touch(node.parent)
                return
        if not node.pins:
            self.leaves.gone(node, HOST)
            self._remove(node)
