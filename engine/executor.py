"""Runs a physical plan: relational steps in DuckDB, AI steps through the runtime."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .ai_ops import filter_probabilities
from .physical import AIFilterStep, PhysicalPlan, SQLStep
from .relational import run_sql
from .runtime import Runtime
from .stats import Stats
from .storage import TableStore


def execute(plan: PhysicalPlan, store: TableStore, runtime: Runtime | None, stats: Stats | None = None) -> pa.Table:
    """All steps in order; the final relation's rows. Model work is counted into stats."""
    return _run(plan, {name: store.table(name) for name in plan.tables}, runtime, stats)


def result_schema(plan: PhysicalPlan, store: TableStore) -> pa.Schema:
    """The result schema, found by running the plan over empty tables (no model work)."""
    empty = {name: store.schema(name).empty_table() for name in plan.tables}
    return _run(plan, empty, None, None).schema


def _run(plan: PhysicalPlan, relations: dict[str, pa.Table], runtime: Runtime | None,
         stats: Stats | None) -> pa.Table:
    relations = dict(relations)
    for step in plan.steps:
        if isinstance(step, SQLStep):
            relations[step.output] = run_sql(step.sql, relations)
        else:
            relations[step.output] = _ai_filter(step, relations[step.input], runtime, stats)
    return relations[plan.result]


def _ai_filter(step: AIFilterStep, rows: pa.Table, runtime: Runtime | None, stats: Stats | None) -> pa.Table:
    kept = rows.drop_columns(list(step.arg_columns))
    if rows.num_rows == 0:
        return kept
    if runtime is None:
        raise RuntimeError("an AI step over rows needs a runtime")
    args = [rows.column(c).to_pylist() for c in step.arg_columns]
    probs = filter_probabilities(runtime, step.template, args, stats)
    return kept.filter(pa.array(np.nan_to_num(probs, nan=0.0) > 0.5))
