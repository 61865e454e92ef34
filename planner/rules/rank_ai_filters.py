"""AI filters on one table asked in the order that asks the model least."""

from __future__ import annotations

from dataclasses import replace

from quail.engine.exec.plan import filter_rank
from quail.planner.core import AICore


def rank_ai_filters(core: AICore) -> AICore:
    """Each table's AI filters by ascending rank (cost per row over the fraction of rows removed,
    plan.filter_rank): a cheap or selective filter first, so the costly ones see fewer rows. The
    executor re-ranks them by the selectivities it observes on the first rows.

    >>> from quail.planner.rules.examples import show
    >>> query = ("SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} a kind and thoughtful review of the "
    ...          "product, in the words of its writer?', body)) AND AI_FILTER(PROMPT('Is {0} short?', body))")
    >>> show(query)
    DuckDB -> __quail_rows_reviews_1: SELECT ... FROM reviews
    AI filters, in this order for the first 64 rows, then ranked by observed selectivity: ...
      AI filter (filter layout, selectivity 0.2) ...: 'Is {0} short?' over [...]
      AI filter (filter layout, selectivity 0.2) ...: 'Is {0} a kind and thoughtful review of the product, ...' over [...]
    DuckDB -> __quail_result: SELECT id FROM "__quail_ai_3" AS "reviews"
    >>> show(query, without="rank_ai_filters")
    DuckDB -> __quail_rows_reviews_1: SELECT ... FROM reviews
    AI filters, in this order for the first 64 rows, then ranked by observed selectivity: ...
      AI filter (filter layout, selectivity 0.2) ...: 'Is {0} a kind and thoughtful review of the product, ...' over [...]
      AI filter (filter layout, selectivity 0.2) ...: 'Is {0} short?' over [...]
    DuckDB -> __quail_result: SELECT id FROM "__quail_ai_3" AS "reviews"
    """
    return replace(core, relations=[
        replace(r, filters=sorted(r.filters, key=lambda call: filter_rank(
            call.template, call.expected_selectivity))) for r in core.relations])
