"""The resident tree's nodes, what each is worth, and which leaf goes next from each tier.

- A node's value (greedy-dual by size and frequency) is set at each use (a
  match or an insert through it) to the age plus its uses times what
  recomputing one of its tokens costs (`slot_cost`: its weights' work, and its
  attention over the context before it): a prefix many statements read
  outlives a one-off scan.
- The age rises to the value of each leaf that goes in order of value, so a
  leaf not used for long falls below those used since, whatever it once earned.
- One heap of offers per tier: the pool's lets the plan's demoted leaves go
  first, then the least valuable; the host and disk tiers', where nothing is
  demoted, the least valuable. The tree says which leaf lies where (`offer`);
  an offer the node has since outgrown (used, demoted, moved, gone) is skipped.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import numpy as np

from quail.engine.kv.host_tier import HostRun
from quail.engine.kv.runs import KV

ATTENTION_SPAN = 4096  # tokens of context at which a token's attention costs about what its weights do
POOL, HOST, DISK = "pool", "host", "disk"


@dataclass(eq=False)
class Node:
    """An edge of tokens after `depth` tokens, and its KV: in the pool (`kv`), or in a lower tier (`host`: the
    host tier's or the disk tier's run, as `host.tier` says; root: neither)."""

    ids: np.ndarray
    kv: KV | None
    parent: "Node | None"
    depth: int = 0
    children: dict[int, "Node"] = field(default_factory=dict)
    value: float = 0.0
    uses: int = 0
    pins: int = 0
    demoted: bool = False
    host: HostRun | None = None
    device_children: int = 0  # children whose KV is in the pool
    host_children: int = 0  # children whose KV is in the host tier


def slot_cost(node: Node) -> float:
    """What computing one of the node's tokens again costs, in tokens of weights' work: one, and its
    attention over the context before it (the middle of the edge), in ATTENTION_SPANs."""
    return 1.0 + (node.depth + len(node.ids) / 2) / ATTENTION_SPAN


class Leaves:
    """The tree's age and its leaves' offers, a heap per tier of (not demoted, value, tie, node)."""

    def __init__(self) -> None:
        self.age = 0.0
        self._heaps: dict[str, list[tuple[bool, float, int, Node]]] = {POOL: [], HOST: [], DISK: []}
        self._tie = itertools.count()

    def use(self, node: Node) -> None:
        """A statement uses the node: its value is the age plus its uses times its tokens' cost."""
        node.uses += 1
        node.value = self.age + node.uses * slot_cost(node)

    def gone(self, node: Node, ordered: bool = True) -> None:
        """A leaf leaves its tier: the age rises to its value, where it went in order of value (not a demoted
        leaf leaving the pool ahead of its turn)."""
        if ordered:
            self.age = max(self.age, node.value)

    def offer(self, node: Node, tier: str) -> None:
        """Offer a leaf of `tier` to go at its current priority."""
        heapq.heappush(self._heaps[tier], (tier != POOL or not node.demoted, node.value, next(self._tie), node))

    def __len__(self) -> int:
        return sum(len(heap) for heap in self._heaps.values())

    def clear(self) -> None:
        for heap in self._heaps.values():
            heap.clear()

    def pop(self, tier: str, at_most: float = float("inf")) -> Node | None:
        """The next leaf of `tier` to go, if it is worth no more than `at_most` (None: none is); offers the
        node has outgrown are dropped on the way."""
        heap = self._heaps[tier]
        while heap:
            kept, value, _, node = heap[0]
            if node.parent is None or value != node.value or (tier == POOL and kept == node.demoted):
                heapq.heappop(heap)
            elif value > at_most and tier != POOL:
                return None
            else:
                return heapq.heappop(heap)[3]
        return None
