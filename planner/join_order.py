"""Join order: dynamic programming over left-deep orders, costed by the model work each order asks for.

Each relation has an estimated row count (its core's rows after its own
filters); each join condition names relations and passes a fraction of the
tuples (AI conditions their selectivity, plain ones PLAIN_SELECTIVITY). An AI
condition is asked once per distinct combination of the rows it names, when
its last relation joins; its cost there is the tokens of those requests: each
distinct anchor document once (its KV serves every partner after it) plus the
rest of the prompt per combination. The cost of an order depends only on the
set joined so far and the relation added, so the dynamic program over subsets
finds the cheapest order exactly (under this model); `orders` enumerates every
order for a brute-force check.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

PLAIN_SELECTIVITY = 0.1


@dataclass(frozen=True)
class Edge:
    """A join condition over relations `refs` (indices); AI ones carry their token estimates."""

    refs: frozenset[int]
    selectivity: float
    ai: bool = False
    anchor: int = 0
    anchor_tokens: float = 0.0
    other_tokens: float = 0.0


def _step(joined: frozenset[int], new: int, sizes: list[float], edges: list[Edge]) -> tuple[float, float]:
    """(model tokens asked, tuples after) when `new` joins the tuples of `joined`."""
    tuples = _tuples(joined, sizes, edges) * sizes[new]
    tokens = 0.0
    for edge in edges:
        if new in edge.refs and edge.refs <= joined | {new}:
            if edge.ai:
                combos = min(tuples, math.prod(sizes[r] for r in edge.refs))
                anchors = min(combos, sizes[edge.anchor])
                tokens += anchors * edge.anchor_tokens + combos * edge.other_tokens
            tuples *= edge.selectivity
    return tokens, tuples


def _tuples(joined: frozenset[int], sizes: list[float], edges: list[Edge]) -> float:
    if not joined:
        return 1.0
    out = math.prod(sizes[r] for r in joined)
    for edge in edges:
        if edge.refs and edge.refs <= joined:
            out *= edge.selectivity
    return out


def cost(order: list[int], sizes: list[float], edges: list[Edge]) -> float:
    """Model tokens an order asks for (conditions on one relation are not join work: leave them out)."""
    total, joined = 0.0, frozenset()
    for new in order:
        total += _step(joined, new, sizes, edges)[0] if joined else 0.0
        joined |= {new}
    return total


def best_order(sizes: list[float], edges: list[Edge]) -> tuple[list[int], float]:
    """The cheapest left-deep order and its cost, by dynamic programming over subsets (ties: query order)."""
    n = len(sizes)
    best: dict[frozenset[int], tuple[float, list[int]]] = {frozenset({i}): (0.0, [i]) for i in range(n)}
    for size in range(2, n + 1):
        for subset in map(frozenset, itertools.combinations(range(n), size)):
            options = []
            for new in sorted(subset):
                rest = subset - {new}
                spent, order = best[rest]
                options.append((spent + _step(rest, new, sizes, edges)[0], order + [new]))
            best[subset] = min(options, key=lambda o: (o[0], o[1]))
    total, order = best[frozenset(range(n))]
    return order, total


def orders(n: int) -> list[list[int]]:
    """Every left-deep order of n relations."""
    return [list(p) for p in itertools.permutations(range(n))]
