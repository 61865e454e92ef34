"""The resident tree's nodes, what each is worth, and which leaf goes next from each tier.

- A node's value (greedy-dual by size and frequency) is set at each use (a
  match or an insert through it) to the age plus its uses times what
  recomputing one of its tokens costs (`slot_cost`: its weights' work, and its
  attention over the context before it): a prefix many statements read
  outlives a one-off scan.
- The age rises to the value of each leaf that goes in order of value, so a
  leaf not used for long falls below those used since, whatever it once earned.
- One heap of offers per tier, the least valuable first. In the pool a leaf the
  plan demoted (the statement that read it will not again) counts DEMOTED_USES
  uses less: a document one statement read and rejected goes before anything
  else, one that several statements read outlives one-off documents even when
  the last of them rejected it. The host and disk tiers take values as they are.
- The tree says which leaf lies where (`offer`); an offer the node has since
  outgrown (used, demoted, moved, gone) is skipped.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import numpy as np

from quail.engine.kv.host_tier import HostRun
from quail.engine.kv.runs import KV

ATTENTION_SPAN = 4096  # tokens of context at which a token's attention costs about what its weights do
DEMOTED_USES = 2  # the uses one statement's reading of a document counts (its requests' match, its KV's fetch)
POOL, HOST, DISK = "pool", "host", "disk"


@dataclass(eq=False)
class Node:
    """An edge of the resident tree, and where its KV lies.

    An edge of tokens after `depth` tokens, and its KV: in the pool (`kv`), or in a lower tier (`host`: the
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


def priority(node: Node, tier: str) -> float:
    """What a leaf of `tier` is worth there: its value, less DEMOTED_USES uses for one the plan demoted in the
    pool."""
    return node.value - DEMOTED_USES * slot_cost(node) if tier == POOL and node.demoted else node.value


class Leaves:
    """The tree's age and its leaves' offers, a heap per tier of (priority, tie, node)."""

    def __init__(self) -> None:
        self.age = 0.0
        self._heaps: dict[str, list[tuple[float, int, Node]]] = {POOL: [], HOST: [], DISK: []}
        self._tie = itertools.count()

    def use(self, node: Node) -> None:
        """A statement uses the node: its value is the age plus its uses times its tokens' cost."""
        node.uses += 1
        node.value = self.age + node.uses * slot_cost(node)

    def gone(self, node: Node, tier: str) -> None:
        """A leaf leaves `tier` (in order of priority): the age rises to its priority there."""
        self.age = max(self.age, priority(node, tier))

    def offer(self, node: Node, tier: str) -> None:
        """Offer a leaf of `tier` to go at its current priority."""
        heapq.heappush(self._heaps[tier], (priority(node, tier), next(self._tie), node))

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
            offered, _, node = heap[0]
            if node.parent is None or offered != priority(node, tier):
                heapq.heappop(heap)
            elif offered > at_most:
                return None
            else:
                return heapq.heappop(heap)[2]
        return None
