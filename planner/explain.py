"""EXPLAIN [ANALYZE]: a physical plan as lines of text, and `EXPLAIN <query>` as a query returning them."""

from __future__ import annotations

import re
from dataclasses import replace

from sqlglot import exp

from quail.engine.physical import CHUNK_ROWS, PhysicalPlan, SQLStep, describe

EXPLAIN = re.compile(r"^\s*EXPLAIN(\s+ANALYZE)?\b", re.IGNORECASE)
COLUMN = "plan"


def split_explain(sql: str) -> tuple[str, bool] | None:
    """(the query after a leading EXPLAIN [ANALYZE], blanked so error positions still point into the
    text; whether ANALYZE was asked), or None when the text is not an EXPLAIN."""
    match = EXPLAIN.match(sql)
    return (" " * match.end() + sql[match.end():], bool(match.group(1))) if match else None


def explain_lines(plan: PhysicalPlan) -> list[str]:
    """The planner's notes, then one line per step in execution order."""
    chunked = [f"note: rows stream in chunks as their model work is done ({CHUNK_ROWS[0]} input rows first, "
               f"doubling up to {CHUNK_ROWS[1]})"] if plan.chunked else []
    return [f"note: {note}" for note in plan.notes] + chunked + [line for step in plan.steps for line in describe(step)]


def explain_plan(plan: PhysicalPlan, analyze: bool) -> PhysicalPlan:
    """A plan whose result is the explained plan's lines, one row each, in a column `plan`;
    with analyze, the plan itself, run for what each step does (executor.analyze)."""
    if analyze:
        return replace(plan, analyze=True)
    rows = exp.Values(expressions=[exp.Tuple(expressions=[exp.Literal.string(line)]) for line in explain_lines(plan)],
                      alias=exp.TableAlias(this=exp.to_identifier("t"), columns=[exp.to_identifier(COLUMN)]))
    sql = exp.select(exp.column(COLUMN)).from_(rows).sql("duckdb")
    return PhysicalPlan((SQLStep(sql, plan.result),), (), plan.result, plan.parameters)
