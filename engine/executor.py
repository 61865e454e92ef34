"""Runs a physical plan: relational steps in DuckDB, AI steps through the runtime."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .ai_ops import Question, classify, yes_probabilities
from .catalog import Catalog
from .physical import AIFilterChain, AIStep, PhysicalPlan, SQLStep
from .relational import run_sql
from .runtime import Runtime
from .work import QueryWork

_TYPES = {"bool": pa.bool_(), "score": pa.float64(), "classify": pa.string()}


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
        elif isinstance(step, AIFilterChain):
            relations[step.output] = _ai_chain(step, relations[step.input], runtime, work)
        else:
            relations[step.output] = _ai_step(step, relations[step.input], runtime, work)
    return relations[plan.result]


def _answers(step: AIStep, rows: pa.Table, runtime: Runtime, work: QueryWork | None) -> pa.Array:
    question = Question(step.template, step.layout, step.labels, step.anchor)
    args = [rows.column(c).to_pylist() for c in step.arg_columns]
    if step.kind == "classify":
        return pa.array(classify(runtime, question, args, work), pa.string())
    probs = yes_probabilities(runtime, question, args, work, step.selectivity, decide=step.kind != "score")
    if step.kind == "score":
        return pa.array(probs, pa.float64(), from_pandas=True)
    return pa.array(np.where(np.isnan(probs), None, probs > 0.5).tolist(), pa.bool_())


def _ai_step(step: AIStep, rows: pa.Table, runtime: Runtime | None, work: QueryWork | None) -> pa.Table:
    base = rows.drop_columns(list(step.arg_columns))
    if rows.num_rows == 0:
        answers = pa.array([], _TYPES.get(step.kind, pa.bool_()))
    elif runtime is None:
        raise RuntimeError("an AI step over rows needs a runtime")
    else:
        answers = _answers(step, rows, runtime, work)
    if step.kind == "filter":
        out = base.filter(pc.fill_null(answers, False)) if rows.num_rows else base
    else:
        out = base.append_column(step.column, answers)
    if work is not None and rows.num_rows:
        stage = {"operator": f"ai_{step.kind}", "output": step.output, "template": step.template,
                 "rows_in": rows.num_rows}
        if step.kind in ("filter", "bool"):
            yes = int(pc.sum(pc.fill_null(answers, False).cast(pa.int64())).as_py() or 0)
            stage.update(rows_out=out.num_rows, selectivity_provided=step.selectivity,
                         selectivity_observed=yes / rows.num_rows)
        work.stages.append(stage)
    return out


def _ai_chain(chain: AIFilterChain, rows: pa.Table, runtime: Runtime | None, work: QueryWork | None) -> pa.Table:
    """Filter chunks of rows through every filter until `limit` rows have passed."""
    expected = float(np.prod([f.selectivity for f in chain.filters]))
    size = max(chain.limit, int(np.ceil(1.5 * chain.limit / expected)))
    kept: list[pa.Table] = []
    start, passed = 0, 0
    while True:
        chunk = rows.slice(start, size)
        for step in chain.filters:
            chunk = _ai_step(step, chunk, runtime, work)
        kept.append(chunk)
        passed += chunk.num_rows
        start += size
        if passed >= chain.limit or start >= rows.num_rows:
            break
        size *= 2
    out = pa.concat_tables(kept) if len(kept) > 1 else kept[0]
    return out.slice(0, chain.limit)
