"""A LIMIT reaches the model: it stops asking once that many rows have passed.

Without AI filters, only that many rows are asked for their AI values.
"""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from quail.planner.core import AICore

UNLIMITED = 1 << 62  # a LIMIT at least this large limits nothing


def limit_into_model(core: AICore) -> AICore:
    """LIMIT n [OFFSET m] as n + m rows for the model, when the first rows passing the filters are the
    answer: a plain projection of one table (no ordering, grouping, DISTINCT, aggregates or window
    functions) with no condition after its AI filters, and no cascade (whose sample is drawn from every
    row). The model then sees rows, in table order, only
    until that many have passed; without AI filters, only that many rows reach the model at all.

    >>> from quail.planner.rules.examples import show
    >>> show("SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} kind?', body)) LIMIT 2")
    DuckDB -> __quail_rows_reviews_1: SELECT ... FROM reviews
    AI filters until 2 rows pass, in table order: __quail_rows_reviews_1 -> __quail_ai_2
      AI filter (filter layout, selectivity 0.2) __quail_rows_reviews_1 -> __quail_ai_2: 'Is {0} kind?' over [...]
    DuckDB -> __quail_result: SELECT id FROM "__quail_ai_2" AS "reviews" LIMIT 2
    >>> show("SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} kind?', body)) LIMIT 2",
    ...      without="limit_into_model")
    DuckDB -> __quail_rows_reviews_1: SELECT ... FROM reviews
    AI filter (filter layout, selectivity 0.2) __quail_rows_reviews_1 -> __quail_ai_2: 'Is {0} kind?' over [...]
    DuckDB -> __quail_result: SELECT id FROM "__quail_ai_2" AS "reviews" LIMIT 2
    >>> show("SELECT id, AI_COMPLETE(PROMPT('Summarize {0}.', body)) AS s FROM reviews LIMIT 2")
    DuckDB -> __quail_rows_reviews_2: SELECT ... FROM reviews LIMIT 2
    AI complete (filter layout, at most 256 tokens a row, greedy) __quail_rows_reviews_2 -> __quail_ai_3: ...
    DuckDB -> __quail_result: SELECT id, "reviews"."__quail_ai_1" AS s FROM "__quail_ai_3" AS "reviews" LIMIT 2
    """
    if len(core.relations) != 1:
        return core
    (relation,) = core.relations
    rows = _rows_needed(core.select)
    if rows is None or relation.after or any(call.targets for call in relation.filters):  # a cascade samples all
        return core
    return replace(core, relations=[replace(relation, limit=rows)])


def _rows_needed(select: exp.Select) -> int | None:
    """n + m of LIMIT n [OFFSET m] when the SELECT's shape lets the first rows be the answer, else None."""
    limit, offset = select.args.get("limit"), select.args.get("offset")
    if limit is None or any(select.args.get(k) for k in ("order", "group", "having", "distinct", "qualify")):
        return None
    if any(isinstance(n, (exp.AggFunc, exp.Window)) for item in select.expressions for n in item.walk()):
        return None
    count, skip = limit.expression, offset.expression if offset is not None else exp.Literal.number(0)
    if not (isinstance(count, exp.Literal) and isinstance(skip, exp.Literal)) or count.is_string or skip.is_string:
        return None
    rows = int(count.this) + int(skip.this)
    return rows if rows < UNLIMITED else None
