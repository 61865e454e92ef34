"""Runs a physical plan: relational steps in DuckDB, AI steps through the runtime."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .ai_ops import filter_probabilities
from .catalog import Catalog
from .physical import AIFilterStep, PhysicalPlan, SQLStep
from .relational import run_sql
from .runtime import Runtime
from .work import QueryWork


def execute(plan: PhysicalPlan, catalog: Catalog, runtime: Runtime | None, work: QueryWork | None = None) -> pa.Table:
    """All steps in order; the final relation's rows. Model work is recorded in `work`."""
    return _run(plan, {name: catalog.table(name) for name in plan.tables}, runtime, work)


def result_schema(plan: PhysicalPlan, catalog: Catalog) -> pa.Schema:
    """The result schema, found by running the plan over empty tables (no model work)."""
    empty = {name: catalog.schema(name).empty_table() for name in plan.tables}
    return _run(plan, empty, None, None).schema


def _run(plan: PhysicalPlan, relations: dict[str, pa.Table], runtime: Runtime | None,
         work: QueryWork | None) -> pa.Table:
    relations = dict(relations)
    for step in plan.steps:
        if isinstance(step, SQLStep):
            relations[step.output] = run_sql(step.sql, relations)
        else:
            relations[step.output] = _ai_filter(step, relations[step.input], runtime, work)
    return relations[plan.result]


def _ai_filter(step: AIFilterStep, rows: pa.Table, runtime: Runtime | None, work: QueryWork | None) -> pa.Table:
    kept = rows.drop_columns(list(step.arg_columns))
    if rows.num_rows == 0:
        return kept
    if runtime is None:
        raise RuntimeError("an AI step over rows needs a runtime")
    args = [rows.column(c).to_pylist() for c in step.arg_columns]
    probs = filter_probabilities(runtime, step.template, args, work, step.selectivity)
    out = kept.filter(pa.array(np.nan_to_num(probs, nan=0.0) > 0.5))
    if work is not None:
        work.stages.append({"operator": "ai_filter", "output": step.output, "template": step.template,
                            "rows_in": rows.num_rows, "rows_out": out.num_rows,
                            "selectivity_provided": step.selectivity,
                            "selectivity_observed": out.num_rows / rows.num_rows})
    return out
