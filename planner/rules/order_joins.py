"""The join order of an AI core: the one whose model work costs least, and others kept for wrong estimates."""

from __future__ import annotations

import itertools
from dataclasses import replace

from quail.planner.core import AICore
from quail.planner.join_order import Work, best_order, by_tokens, cost, pareto_orders

ROWS_MISESTIMATED = (0.1, 10.0)  # the estimates' error each kept join order guards against


def order_joins(core: AICore) -> AICore:
    """The cheapest of the join orders no other order beats on tokens, attention pairs, KV writes and reads
    (join_order.py), priced by the core's rank (the speed of light on the serving device, or tokens); and
    the cheapest were one table's rows ten times more or fewer than estimated, for the executor to choose
    among by the cores' observed rows. Inner joins only: outer joins keep the query's order, as does a
    forced order.

    >>> from quail.planner.rules.examples import notes
    >>> query = ("SELECT r.id, m.id FROM makers m, reviews r, products p WHERE AI_FILTER(PROMPT('Does {0} "
    ...          "suit {1}?', r.body, m.story)) AND p.maker = m.id AND p.price < 10")
    >>> notes(query)
    join order m, p, r: ~103 model tokens, ... (the query's order: m, r, p: ~4,743 model tokens, ...)
    >>> notes(query, without="order_joins")
    """
    if not core.orders_joins:
        return core
    relations = core.relations
    sizes = [r.rows for r in relations]
    edges = [core.edge(c) for c in core.pending if len(c.refs) > 1 and c.outer_on is None]
    pareto = sorted(pareto_orders(sizes, edges), key=lambda p: (core.rank(p[0]), p[1]))
    work, order = pareto[0]
    query_order = list(range(len(relations)))
    notes = [f"join order {_priced(core, order, work)} (the query's order: "
             f"{_priced(core, query_order, cost(query_order, sizes, edges))})"]
    if len(pareto) > 1:
        notes.append("other join orders no plan beats on tokens, attention pairs, KV writes and reads: "
                     + "; ".join(_priced(core, o, w) for w, o in pareto[1:]))
    candidates = [order]
    for i, factor in itertools.product(range(len(sizes)), ROWS_MISESTIMATED):
        scenario = [size * factor if j == i else size for j, size in enumerate(sizes)]
        other = best_order(scenario, edges, core.rank)[0]
        if other not in candidates:
            candidates.append(other)

    def pick(rows: list[int]) -> int:
        return min(range(len(candidates)), key=lambda k: (core.rank(cost(candidates[k], rows, edges)), k))

    return replace(core, orders=candidates, pick=pick if len(candidates) > 1 else None, notes=core.notes + notes)


def _priced(core: AICore, order: list[int], work: Work) -> str:
    """An order with its estimated model work and rank, as EXPLAIN shows it."""
    ranked = core.rank(work)
    price = "" if core.rank is by_tokens else f", ~{ranked:.3g} s at the speed of light"
    return (f"{', '.join(core.relations[i].alias for i in order)}: ~{work.tokens:,.0f} model tokens, "
            f"{work.pairs:,.0f} attention pairs, {work.kv_written:,.0f} KV rows written, "
            f"{work.kv_read:,.0f} read{price}")
