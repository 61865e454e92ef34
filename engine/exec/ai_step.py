"""An AI step's execution: its rows handed to its kind's operator (engine/ai/, `operator.of`), the output kept.

- Yes/no steps (filters, scores, boolean values) of several relations may share their passes
  (`asking_together`); a category or a text is asked alone.
- The operator shapes the output (a filter keeps the rows answered yes; any other kind adds its column).
- Each step's rows in, and what its operator reports, go to the query's stages (EXPLAIN ANALYZE).
"""

from __future__ import annotations

from typing import Callable

import pyarrow as pa

from quail.engine.ai.asking import Question
from quail.engine.ai.asking import asking_together as model_asking_together
from quail.engine.ai.kinds import KINDS
from quail.engine.ai.operator import Call, of
from quail.engine.exec.plan import AIStep
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.runtime import Runtime


def asks_yes_no(step: AIStep) -> bool:
    """Whether the step asks a yes/no question of each row (its passes may be queued before its answers are
    read: `asking_together`); a cascade asks its own (ai_cascade.py)."""
    return of(step.kind).shared and step.targets is None


def call_of(step: AIStep, rows: pa.Table) -> Call:
    """The step's question over these rows."""
    schema = step.generation.schema if step.generation is not None else None
    question = Question(step.template, step.layout, step.labels, step.anchor, step.answers, schema)
    return Call(question, [rows.column(c).to_pylist() for c in step.arg_columns], step.selectivity, step.generation)


def ai_step(step: AIStep, rows: pa.Table, runtime: Runtime | None, work: QueryWork | None) -> pa.Table:
    """The step's output over its rows."""
    kind = of(step.kind)
    if kind.shared:
        return asked_together([(step, rows)], runtime, work)[0]
    if rows.num_rows and runtime is None:
        raise RuntimeError("an AI step over rows needs a runtime")
    call = call_of(step, rows)
    answers = kind.answer(runtime, call, work) if rows.num_rows else pa.array([], KINDS[step.kind].value)
    return answered(step, rows, call, answers, work)


def asked_together(steps: list[tuple[AIStep, pa.Table]], runtime: Runtime | None,
                   work: QueryWork | None) -> list[pa.Table]:
    """Each yes/no step's output over its rows (filters: the rows that pass), the model asked once for
    all of them (their passes shared)."""
    return asking_together(steps, runtime, work)()


def asking_together(steps: list[tuple[AIStep, pa.Table]], runtime: Runtime | None,
                    work: QueryWork | None) -> Callable[[], list[pa.Table]]:
    """As asked_together, the passes queued now; what it returns reads the answers and gives the outputs."""
    calls = [call_of(step, rows) for step, rows in steps]
    asked = [of(step.kind).ask(call) for (step, rows), call in zip(steps, calls) if rows.num_rows]
    if asked and runtime is None:
        raise RuntimeError("an AI step over rows needs a runtime")
    asking = model_asking_together(runtime, asked, work) if asked else None

    def outputs() -> list[pa.Table]:
        probs = iter(asking.read() if asking is not None else [])
        return [answered(step, rows, call, of(step.kind).values(next(probs)) if rows.num_rows
                          else pa.array([], KINDS[step.kind].value or pa.bool_()), work)
                for (step, rows), call in zip(steps, calls)]
    return outputs


def answered(step: AIStep, rows: pa.Table, call: Call, answers: pa.Array, work: QueryWork | None) -> pa.Table:
    """The step's output from its answers, its stage recorded."""
    kind = of(step.kind)
    out = kind.output(rows.drop_columns(list(step.arg_columns)), answers, step.column)
    if work is not None and rows.num_rows:
        record(work, {"operator": f"ai_{step.kind}", "output": step.output, "template": step.template,
                      "rows_in": rows.num_rows, **kind.stage(call, answers, out)})
    return out


def record(work: QueryWork, stage: dict) -> None:
    """Add an AI operator's stage, or its counts to the stage of the same operator run before (chunks)."""
    same = next((s for s in work.stages if s["operator"] == stage["operator"] and s["output"] == stage["output"]),
                None)
    if same is None:
        work.stages.append(stage)
        return
    same["rows_in"] += stage["rows_in"]
    if "rows_out" in stage:
        yes = same["selectivity_observed"] * (same["rows_in"] - stage["rows_in"]) \
            + stage["selectivity_observed"] * stage["rows_in"]
        same["rows_out"] += stage["rows_out"]
        same["selectivity_observed"] = yes / same["rows_in"]
