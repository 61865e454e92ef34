"""Join order: the dynamic program against brute force (result invariance over orders: test_ai_sql.py)."""

from __future__ import annotations

import itertools
import random

import pytest

from quail.planner.join_order import Edge, best_order, cost, orders


def _instance(rng: random.Random, n: int) -> tuple[list[float], list[Edge]]:
    sizes = [rng.choice([3, 12, 287, 500, 5000]) * rng.random() + 1 for _ in range(n)]
    edges = []
    for a, b in itertools.combinations(range(n), 2):
        if rng.random() < 0.6:
            ai = rng.random() < 0.7
            edges.append(Edge(frozenset({a, b}), rng.choice([0.05, 0.2, 0.5]), ai, rng.choice([a, b]),
                              rng.choice([25, 150, 2500]), rng.choice([8, 40, 300])))
    return sizes, edges


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_dynamic_program_finds_the_brute_force_minimum(n):
    rng = random.Random(n)
    for _ in range(30):
        sizes, edges = _instance(rng, n)
        order, total = best_order(sizes, edges)
        assert sorted(order) == list(range(n))
        assert total == pytest.approx(cost(order, sizes, edges))
        assert total == pytest.approx(min(cost(o, sizes, edges) for o in orders(n)))
