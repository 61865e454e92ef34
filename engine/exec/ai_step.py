"""An AI step's execution (filter, score, classify, complete): rows to questions, answers to values.

- Yes/no steps (filters, scores, boolean values) of several relations may share their passes
  (`asking_together`); a category or a text is asked alone.
- A filter keeps the rows answered yes; any other kind adds its value as a column.
- Each step's rows in and out and observed selectivity go to the query's stages (EXPLAIN ANALYZE).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quail.engine.ai.completion import complete
from quail.engine.ai.kinds import KINDS, answered_yes
from quail.engine.ai.operators import Ask, Question, classify
from quail.engine.ai.operators import asking_together as model_asking_together
from quail.engine.exec.plan import AIStep
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.runtime import Runtime


def asks_yes_no(step: AIStep) -> bool:
    """Whether the step asks a yes/no question of each row (its passes may be queued before its answers are
    read: `asking_together`)."""
    return KINDS[step.kind].answer not in _ANSWERED_ALONE


def _question(step: AIStep) -> Question:
    schema = step.generation.schema if step.generation is not None else None
    return Question(step.template, step.layout, step.labels, step.anchor, step.answers, schema)


def _args(step: AIStep, rows: pa.Table) -> list[list[str | None]]:
    return [rows.column(c).to_pylist() for c in step.arg_columns]


def _ask(step: AIStep, rows: pa.Table, work: QueryWork | None) -> Ask:
    """A filter's or score's question over the rows."""
    return Ask(_question(step), _args(step, rows), step.selectivity, decide=KINDS[step.kind].answer == "yes_no",
               forget_rejected=KINDS[step.kind].keeps_rows)


def _values(step: AIStep, probs: np.ndarray) -> pa.Array:
    if KINDS[step.kind].answer == "probability":
        return pa.array(probs, pa.float64(), from_pandas=True)
    return pa.array(np.where(np.isnan(probs), None, answered_yes(probs)).tolist(), pa.bool_())


def ai_step(step: AIStep, rows: pa.Table, runtime: Runtime | None, work: QueryWork | None) -> pa.Table:
    answer = KINDS[step.kind].answer
    if answer not in _ANSWERED_ALONE:
        return asked_together([(step, rows)], runtime, work)[0]
    if rows.num_rows and runtime is None:
        raise RuntimeError("an AI step over rows needs a runtime")
    answers = pa.array(_ANSWERED_ALONE[answer](runtime, step, _args(step, rows), work) if rows.num_rows else [],
                       pa.string())
    return _answered(step, rows, answers, work)


_ANSWERED_ALONE = {  # the kinds whose steps are not asked together with others: their answers, by how answered
    "category": lambda runtime, step, args, work: classify(runtime, _question(step), args, work),
    "text": lambda runtime, step, args, work: complete(runtime, _question(step), args, step.generation, work),
}


def asked_together(steps: list[tuple[AIStep, pa.Table]], runtime: Runtime | None,
                    work: QueryWork | None) -> list[pa.Table]:
    """Each yes/no step's output over its rows (filters: the rows that pass), the model asked once for
    all of them (their passes shared)."""
    return asking_together(steps, runtime, work)()


def asking_together(steps: list[tuple[AIStep, pa.Table]], runtime: Runtime | None,
                     work: QueryWork | None) -> Callable[[], list[pa.Table]]:
    """As asked_together, the passes queued now; what it returns reads the answers and gives the outputs."""
    asked = [_ask(step, rows, work) for step, rows in steps if rows.num_rows]
    if asked and runtime is None:
        raise RuntimeError("an AI step over rows needs a runtime")
    asking = model_asking_together(runtime, asked, work) if asked else None
    empty = {step.kind: pa.array([], KINDS[step.kind].value or pa.bool_()) for step, _ in steps}

    def outputs() -> list[pa.Table]:
        probs = iter(asking.read() if asking is not None else [])
        return [_answered(step, rows, _values(step, next(probs)) if rows.num_rows else empty[step.kind], work)
                for step, rows in steps]
    return outputs


def _answered(step: AIStep, rows: pa.Table, answers: pa.Array, work: QueryWork | None) -> pa.Table:
    """The step's output from its answers (a filter keeps the rows answered yes), its stage recorded."""
    base = rows.drop_columns(list(step.arg_columns))
    if KINDS[step.kind].keeps_rows:
        out = base.filter(pc.fill_null(answers, False)) if rows.num_rows else base
    else:
        out = base.append_column(step.column, answers)
    if work is not None and rows.num_rows:
        stage = {"operator": f"ai_{step.kind}", "output": step.output, "template": step.template,
                 "rows_in": rows.num_rows}
        if KINDS[step.kind].answer == "yes_no":
            yes = int(pc.sum(pc.fill_null(answers, False).cast(pa.int64())).as_py() or 0)
            stage.update(rows_out=out.num_rows, selectivity_provided=step.selectivity,
                         selectivity_observed=yes / rows.num_rows)
        record(work, stage)
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
