"""Join order: the dynamic program against brute force (result invariance over orders: test_ai_sql.py)."""

from __future__ import annotations

import itertools
import random

import pytest

from quail.engine.runtime.loading import DUMMY_SHAPES
from quail.planner.cost import DEVICES, rank_by_sol, sol_seconds
from quail.planner.join_order import Edge, Work, best_order, by_tokens, cost, orders, pareto_orders


def _instance(rng: random.Random, n: int) -> tuple[list[float], list[Edge]]:
    sizes = [rng.choice([3, 12, 287, 500, 5000]) * rng.random() + 1 for _ in range(n)]
    edges = []
    for a, b in itertools.combinations(range(n), 2):
        if rng.random() < 0.6:
            ai = rng.random() < 0.7
            edges.append(Edge(frozenset({a, b}), rng.choice([0.05, 0.2, 0.5]), ai, rng.choice([a, b]),
                              rng.choice([25, 150, 2500]), rng.choice([8, 40, 300])))
    return sizes, edges


SOL = rank_by_sol(lambda stats: sol_seconds(stats, DUMMY_SHAPES["qwen3-4b"], DEVICES["h200"], "bf16", 16384))


@pytest.mark.parametrize("rank", [by_tokens, SOL], ids=["tokens", "speed-of-light"])
@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_dynamic_program_finds_the_brute_force_minimum(n, rank):
    rng = random.Random(n)
    for _ in range(30):
        sizes, edges = _instance(rng, n)
        order, work = best_order(sizes, edges, rank)
        assert sorted(order) == list(range(n))
        assert work == cost(order, sizes, edges)
        assert rank(work) == pytest.approx(min(rank(cost(o, sizes, edges)) for o in orders(n)))


@pytest.mark.parametrize("n", [3, 4, 5])
def test_pareto_orders_are_the_undominated_complete_orders(n):
    rng = random.Random(10 + n)
    for _ in range(20):
        sizes, edges = _instance(rng, n)
        every = [cost(o, sizes, edges) for o in orders(n)]
        undominated = {w.counts() for w in every if not any(v.dominates(w) for v in every)}
        assert {w.counts() for w, _ in pareto_orders(sizes, edges)} == undominated


def test_work_of_one_ai_join_by_hand():
    """Two anchors of 100 tokens, three partners of 10 tokens each: every pair asked."""
    edge = Edge(frozenset({0, 1}), 0.2, True, 0, 100.0, 10.0)
    work = cost([0, 1], [2.0, 3.0], [edge])
    assert work == Work(tokens=2 * 100 + 6 * 10, pairs=2 * 5050 + 6 * (10 * 100 + 55),
                        kv_written=200, kv_read=600)


def test_resident_anchors_are_read_not_computed():
    """Half the two anchors resident: one anchor's tokens, pairs and KV writes left, every partner's reads the
    same; the speed of light of the work less."""
    cold = Edge(frozenset({0, 1}), 0.2, True, 0, 100.0, 10.0)
    warm = Edge(frozenset({0, 1}), 0.2, True, 0, 100.0, 10.0, anchor_resident=0.5)
    work = cost([0, 1], [2.0, 3.0], [warm])
    assert work == Work(tokens=100 + 6 * 10, pairs=5050 + 6 * (10 * 100 + 55), kv_written=100, kv_read=600)
    assert SOL(work) < SOL(cost([0, 1], [2.0, 3.0], [cold]))


def test_the_speed_of_light_spreads_the_work_over_the_replicas():
    from quail.engine.runtime.counters import Stats

    work = Stats(fresh_tokens=100_000, attention_pairs=10_000_000, kv_written=100_000)
    one = sol_seconds(work, DUMMY_SHAPES["qwen3-4b"], DEVICES["h200"], "bf16", 16384)
    assert sol_seconds(work, DUMMY_SHAPES["qwen3-4b"], DEVICES["h200"], "bf16", 16384, replicas=2) == one / 2
