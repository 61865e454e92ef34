"""EXPLAIN: a physical plan as lines of text, and `EXPLAIN <query>` as a query returning them."""

from __future__ import annotations

import re

from sqlglot import exp

from quail.engine.physical import AIFilterChain, AIStep, PhysicalPlan, SQLStep

EXPLAIN = re.compile(r"^\s*EXPLAIN\b", re.IGNORECASE)
COLUMN = "plan"


def split_explain(sql: str) -> str | None:
    """The query after a leading EXPLAIN (blanked, so error positions still point into the text), or None."""
    match = EXPLAIN.match(sql)
    return " " * match.end() + sql[match.end():] if match else None


def _ai_line(step: AIStep) -> str:
    anchor = f", anchor {{{step.anchor}}}" if step.anchor else ""
    return (f"AI {step.kind} ({step.layout} layout{anchor}, selectivity {step.selectivity:g}) "
            f"{step.input} -> {step.output}: {step.template!r} over {list(step.arg_columns)}")


def explain_lines(plan: PhysicalPlan) -> list[str]:
    """The planner's notes, then one line per step in execution order."""
    lines = [f"note: {note}" for note in plan.notes]
    for step in plan.steps:
        if isinstance(step, AIStep):
            lines.append(_ai_line(step))
        elif isinstance(step, AIFilterChain):
            lines.append(f"AI filters until {step.limit} rows pass, in table order: {step.input} -> {step.output}")
            lines += ["  " + _ai_line(f) for f in step.filters]
        else:
            lines.append(f"DuckDB -> {step.output}: {step.sql}")
    return lines


def explain_plan(plan: PhysicalPlan) -> PhysicalPlan:
    """A plan whose result is the explained plan's lines, one row each, in a column `plan`."""
    rows = exp.Values(expressions=[exp.Tuple(expressions=[exp.Literal.string(line)]) for line in explain_lines(plan)],
                      alias=exp.TableAlias(this=exp.to_identifier("t"), columns=[exp.to_identifier(COLUMN)]))
    sql = exp.select(exp.column(COLUMN)).from_(rows).sql("duckdb")
    return PhysicalPlan((SQLStep(sql, plan.result),), (), plan.result, plan.parameters)
