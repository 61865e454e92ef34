"""Which plans stream their rows chunk by chunk: one relation's rows through AI steps, then a row-wise tail.

Each row's answers depend on that row alone (the prompt is a function of the
row), so running the AI steps over consecutive chunks of their input, and a
tail that only projects and filters row by row, gives the same rows in the
same order as running them over everything at once; the first rows leave
after the first chunk's forward passes instead of after the whole query.
"""

from __future__ import annotations

import dataclasses

import sqlglot
from sqlglot import exp

from quail.engine.exec.plan import PhysicalPlan, SQLStep

_SCALAR = {"TO_JSON"}  # functions sqlglot does not know (Anonymous) that are row-wise: AI_CLASSIFY's object
_WHOLE = ("joins", "group", "having", "order", "limit", "offset", "distinct", "qualify", "windows", "with_")


def stream_in_chunks(plan: PhysicalPlan) -> PhysicalPlan:
    """The plan marked `chunked` where its shape allows: leading SQL steps, a chain of AI steps (no LIMIT
    reaching the model) each reading the previous one's output, and a row-wise final SQL step."""
    steps = plan.steps
    lead = next((i for i, step in enumerate(steps) if not isinstance(step, SQLStep)), len(steps))
    middle, tail = steps[lead:-1], steps[-1]
    if plan.analyze or lead == 0 or not middle or not isinstance(tail, SQLStep):
        return plan
    source = steps[lead - 1].output
    for step in middle:
        if not step.row_by_row() or step.input != source:
            return plan
        source = step.output
    row_wise = tail.picks.source == source and tail.picks.row_by_row() if tail.picks is not None \
        else _row_wise(tail.sql, source)
    return dataclasses.replace(plan, chunked=True) if row_wise else plan


def _row_wise(sql: str, source: str) -> bool:
    """Whether a SELECT reads only `source` and computes each output row from one input row."""
    tree = sqlglot.parse_one(sql, read="duckdb")
    if not isinstance(tree, exp.Select) or any(tree.args.get(key) for key in _WHOLE):
        return False
    table = tree.args["from_"].this
    if not isinstance(table, exp.Table) or table.name != source:
        return False
    return not any(isinstance(node, (exp.AggFunc, exp.Window, exp.Select))
                   or isinstance(node, exp.Anonymous) and node.name.upper() not in _SCALAR
                   for node in tree.walk() if node is not tree)
