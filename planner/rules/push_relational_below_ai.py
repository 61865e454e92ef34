"""Relational conditions run below AI work: in a table's first statement, before its model is asked."""

from __future__ import annotations

from dataclasses import replace

from quail.planner.core import AICore


def push_relational_below_ai(core: AICore) -> AICore:
    """Each table's conditions that ask nothing of the model run before its AI filters: they cost next to
    nothing, and every row they remove is a row the model is not asked about.

    >>> from quail.planner.rules.examples import show
    >>> show("SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} kind?', body)) AND stars > 3")
    DuckDB -> __quail_rows_reviews_1: SELECT ... FROM reviews WHERE stars > 3
    AI filter (filter layout, selectivity 0.2) __quail_rows_reviews_1 -> __quail_ai_2: 'Is {0} kind?' over [...]
    DuckDB -> __quail_result: SELECT id FROM "__quail_ai_2" AS "reviews"
    >>> show("SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} kind?', body)) AND stars > 3",
    ...      without="push_relational_below_ai")
    DuckDB -> __quail_rows_reviews_1: SELECT ... FROM reviews
    AI filter (filter layout, selectivity 0.2) __quail_rows_reviews_1 -> __quail_ai_2: 'Is {0} kind?' over [...]
    DuckDB -> __quail_core_reviews_3: SELECT * FROM "__quail_ai_2" AS "reviews" WHERE stars > 3
    DuckDB -> __quail_result: SELECT id FROM "__quail_core_reviews_3" AS "reviews"
    """
    return replace(core, relations=[
        replace(r, before=r.before + [c for c in r.after if c.relational],
                after=[c for c in r.after if not c.relational])
        for r in core.relations])
