"""Join order: dynamic programming over left-deep orders, keeping every plan no other plan beats.

Each relation has an estimated row count (its core's rows after its own
filters); each join condition names relations and passes a fraction of the
tuples (AI conditions their selectivity, plain ones PLAIN_SELECTIVITY). An AI
condition is asked once per distinct combination of the rows it names, when
its last relation joins. Its work there: each distinct anchor document once
(its KV written, and read by every partner after it) plus the rest of the
prompt per combination, counted as the speed of light counts work (`Work`:
fresh tokens, attention pairs, KV rows written and read). The share of the
anchor documents' tokens resident in the KV pool when the plan is made
(`Edge.anchor_resident`) is not computed again: no fresh tokens, pairs or KV
written for it, only the partners' reads of it.

The work of an order is the sum of its steps, and a step's work depends only
on the set joined so far and the relation added. So for each set the dynamic
program keeps the partial orders not Pareto-dominated on the four counts (one
that is dominated can never lead to a cheaper complete order under a ranking
monotone in each count), and finally picks the cheapest by a ranking: the
speed-of-light seconds on the serving device, or tokens when there is none.
`orders` enumerates every order for a brute-force check.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields
from typing import Callable

PLAIN_SELECTIVITY = 0.1
MAX_SEARCHED = 10  # tables whose orders the dynamic program searches (2^n subsets): more join as written


@dataclass(frozen=True)
class Edge:
    """A join condition over relations, with its AI costs.

    A join condition over relations `refs` (indices); AI ones carry their token estimates, and the share of
    the anchor documents' tokens resident in the KV pool."""

    refs: frozenset[int]
    selectivity: float
    ai: bool = False
    anchor: int = 0
    anchor_tokens: float = 0.0
    other_tokens: float = 0.0
    anchor_resident: float = 0.0


@dataclass(frozen=True)
class Work:
    """Model work an order asks for, in the speed of light's terms."""

    tokens: float = 0.0
    pairs: float = 0.0
    kv_written: float = 0.0
    kv_read: float = 0.0

    def __add__(self, other: "Work") -> "Work":
        return Work(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def dominates(self, other: "Work") -> bool:
        """At most as much of every count, and less of one."""
        mine, theirs = self.counts(), other.counts()
        return all(a <= b for a, b in zip(mine, theirs)) and mine != theirs

    def counts(self) -> tuple[float, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


Rank = Callable[[Work], float]


def by_tokens(work: Work) -> float:
    return work.tokens


def _causal(q: float, c: float = 0.0) -> float:
    """Attention pairs of q new tokens over c resident ones."""
    return q * c + q * (q + 1) / 2


def _step(joined: frozenset[int], new: int, sizes: list[float], edges: list[Edge]) -> tuple[Work, float]:
    """(model work asked, tuples after) when `new` joins the tuples of `joined`."""
    tuples = _tuples(joined, sizes, edges) * sizes[new]
    work = Work()
    for edge in edges:
        if new in edge.refs and edge.refs <= joined | {new}:
            if edge.ai:
                combos = min(tuples, math.prod(sizes[r] for r in edge.refs))
                fresh = min(combos, sizes[edge.anchor]) * (1 - edge.anchor_resident)  # anchors computed
                a, o = edge.anchor_tokens, edge.other_tokens
                work += Work(fresh * a + combos * o, fresh * _causal(a) + combos * _causal(o, a),
                             fresh * a, combos * a)
            tuples *= edge.selectivity
    return work, tuples


def _tuples(joined: frozenset[int], sizes: list[float], edges: list[Edge]) -> float:
    if not joined:
        return 1.0
    out = math.prod(sizes[r] for r in joined)
    for edge in edges:
        if edge.refs and edge.refs <= joined:
            out *= edge.selectivity
    return out


def cost(order: list[int], sizes: list[float], edges: list[Edge]) -> Work:
    """Model work an order asks for (conditions on one relation are not join work: left out)."""
    total, joined = Work(), frozenset()
    for new in order:
        if joined:
            total += _step(joined, new, sizes, edges)[0]
        joined |= {new}
    return total


def _frontier(plans: list[tuple[Work, list[int]]]) -> list[tuple[Work, list[int]]]:
    """The plans no other plan dominates (of equal work, the first in query order)."""
    plans = sorted(plans, key=lambda p: (p[0].counts(), p[1]))
    kept: list[tuple[Work, list[int]]] = []
    for work, order in plans:
        if not any(w.dominates(work) or w == work for w, _ in kept):
            kept.append((work, order))
    return kept


def pareto_orders(sizes: list[float], edges: list[Edge]) -> list[tuple[Work, list[int]]]:
    """Every complete left-deep order not dominated on (tokens, pairs, KV written, KV read), by dynamic
    programming over subsets; beyond MAX_SEARCHED tables, the order as written alone."""
    n = len(sizes)
    if n > MAX_SEARCHED:
        return [(cost(list(range(n)), sizes, edges), list(range(n)))]
    plans: dict[frozenset[int], list[tuple[Work, list[int]]]] = {frozenset({i}): [(Work(), [i])] for i in range(n)}
    for size in range(2, n + 1):
        for subset in map(frozenset, itertools.combinations(range(n), size)):
            options = []
            for new in sorted(subset):
                step = _step(subset - {new}, new, sizes, edges)[0]
                options += [(work + step, order + [new]) for work, order in plans[subset - {new}]]
            plans[subset] = _frontier(options)
    return plans[frozenset(range(n))]


def best_order(sizes: list[float], edges: list[Edge], rank: Rank = by_tokens) -> tuple[list[int], Work]:
    """The order of least rank among the Pareto orders, and its work (ties: query order)."""
    work, order = min(pareto_orders(sizes, edges), key=lambda p: (rank(p[0]), p[1]))
    return order, work


def orders(n: int) -> list[list[int]]:
    """Every left-deep order of n relations."""
    return [list(p) for p in itertools.permutations(range(n))]
