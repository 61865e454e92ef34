"""EXPLAIN [ANALYZE | (FORMAT TEXT | SUBSTRAIT)]: a plan as text lines or Substrait, as a query returning them."""

from __future__ import annotations

import base64
import re
from dataclasses import replace

from sqlglot import exp

from quail.engine.errors import InvalidArgument
from quail.engine.exec.catalog import Catalog
from quail.engine.exec.plan import PhysicalPlan, SQLStep
from quail.engine.runtime.estimates import CHUNK_ROWS

from quail.planner.substrait.producer import export_plan

EXPLAIN = re.compile(r"^\s*EXPLAIN\b(?:\s+(ANALYZE)\b|\s*\(\s*FORMAT\s+(\w+)\s*\))?", re.IGNORECASE)
COLUMN = "plan"
FORMATS = ("text", "substrait")


def split_explain(sql: str) -> tuple[str, str] | None:
    """(the query after a leading EXPLAIN [ANALYZE | (FORMAT ...)], blanked so error positions still point
    into the text; how to explain it: "text", "analyze" or "substrait"), or None when the text is not an EXPLAIN."""
    match = EXPLAIN.match(sql)
    if match is None:
        return None
    mode = "analyze" if match.group(1) else (match.group(2) or "text").lower()
    if match.group(2) and mode not in FORMATS:
        raise InvalidArgument(f"EXPLAIN (FORMAT {match.group(2)}) is not supported: use TEXT or SUBSTRAIT")
    return " " * match.end() + sql[match.end():], mode


def explain_lines(plan: PhysicalPlan) -> list[str]:
    """The planner's notes, then one line per step in execution order."""
    chunked = [f"note: rows stream in chunks as their model work is done ({CHUNK_ROWS[0]} input rows first, "
               f"doubling up to {CHUNK_ROWS[1]})"] if plan.chunked else []
    steps = [line for step in plan.steps for line in step.describe()]
    return [f"note: {note}" for note in plan.notes] + chunked + steps


def explain_plan(plan: PhysicalPlan, mode: str, catalog: Catalog) -> PhysicalPlan:
    """A plan whose result is the explained plan's lines, one row each, in a column `plan`; with "analyze",
    the plan itself, run for what each step does (executor.analyze); with "substrait", one row holding
    the serialized Substrait plan (binary)."""
    if mode == "analyze":
        return replace(plan, analyze=True)
    if mode == "substrait":
        encoded = base64.b64encode(export_plan(plan, catalog).SerializeToString()).decode()
        sql = exp.select(exp.alias_(exp.FromBase64(this=exp.Literal.string(encoded)), COLUMN)).sql("duckdb")
        return PhysicalPlan((SQLStep(sql, plan.result),), (), plan.result, plan.parameters)
    rows = exp.Values(expressions=[exp.Tuple(expressions=[exp.Literal.string(line)]) for line in explain_lines(plan)],
                      alias=exp.TableAlias(this=exp.to_identifier("t"), columns=[exp.to_identifier(COLUMN)]))
    sql = exp.select(exp.column(COLUMN)).from_(rows).sql("duckdb")
    return PhysicalPlan((SQLStep(sql, plan.result),), (), plan.result, plan.parameters)
