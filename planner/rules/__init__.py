"""The planner's rules over an AI core (planner/core.py), applied in the order of RULES.

Each is a function from core to core in a file of its own:

1. push_relational_below_ai: a table's relational conditions before its AI filters;
2. rank_ai_filters: a table's AI filters, the cheapest per row removed first;
3. limit_into_model: a LIMIT stops the model once enough rows have passed;
4. order_joins: the join order whose model work costs least (others kept for wrong estimates);
5. advise_anchor: a note when an AI join's other document would be the cheaper anchor.

Without a rule the plan still answers the query, asking the model as it is written
(plan_sql's `rules` leaves rules out; each rule's doctest shows a plan with and without it).
"""

from __future__ import annotations

from typing import Callable

from quail.planner.core import AICore
from quail.planner.rules.advise_anchor import advise_anchor
from quail.planner.rules.limit_into_model import limit_into_model
from quail.planner.rules.order_joins import order_joins
from quail.planner.rules.push_relational_below_ai import push_relational_below_ai
from quail.planner.rules.rank_ai_filters import rank_ai_filters

Rule = Callable[[AICore], AICore]
RULES: tuple[Rule, ...] = (push_relational_below_ai, rank_ai_filters, limit_into_model, order_joins, advise_anchor)


def optimize(core: AICore, rules: tuple[Rule, ...] = RULES) -> AICore:
    """The core after each rule in turn."""
    for rule in rules:
        core = rule(core)
    return core
