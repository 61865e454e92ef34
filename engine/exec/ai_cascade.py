"""A cascade's execution: a filter or a classification with targets, the model asked only where a proxy cannot.

- The targets: a filter's recall and / or precision, a classification's accuracy, each with its confidence.
- The rows with no NULL argument are the cascade's rows (a NULL argument answers neither: the row is not kept).
- engine/ai/cascade.py (a classification's: cascade_classify.py) draws the sample, fits the proxy on the
  embeddings of each row's documents (the server's embedding model, as AI_EMBED's), chooses the thresholds,
  and asks the model about the sample, then the rows the proxy cannot decide: the step's own question, one
  call each.
- The sample's seed is fixed by the question and the rows' documents: the same query over the same rows
  keeps the same rows. What a cascade learned (answers, the proxy's scores) is kept in the runtime's memo
  under the same key, so a later cascade of that question over those rows (other targets too) asks the
  model only about rows none asked before; a changed row changes the key.
- Its stages: the filter's (rows in, rows out) and the cascade's report (its figures, and its line of EXPLAIN
  ANALYZE), which the server's metrics count. The report's stage is added once the thresholds are set, before
  the band is asked (a running query's figures: quail_queries), and completed when the cascade ends.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa

from quail.engine.ai.asking import asking_together
from quail.engine.ai.asking import present as present_rows
from quail.engine.ai.cascade import Accounting, Known, run
from quail.engine.ai.cascade_classify import classify as classify_cascade
from quail.engine.ai.kinds import KINDS
from quail.engine.ai.operator import Call, of
from quail.engine.exec.ai_step import answered, call_of
from quail.engine.exec.plan import AIStep
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.runtime import Runtime


def _key(call: Call, texts: list[str]) -> bytes:
    """What the cascade's sample and answers depend on: the question and the rows' documents, in order."""
    digest = hashlib.blake2b(repr(call.question).encode(), digest_size=16)
    for text in texts:
        digest.update(len(text).to_bytes(8, "little") + text.encode())
    return digest.digest()


def ai_cascade(step: AIStep, rows: pa.Table, runtime: Runtime | None, work: QueryWork | None) -> pa.Table:
    """The step's output over its rows, as a cascade: a filter's rows kept, a classification's categories."""
    if rows.num_rows and runtime is None:
        raise RuntimeError("an AI step over rows needs a runtime")
    call = call_of(step, rows)
    present = np.array(present_rows(call.args), np.int64)
    texts = ["\n".join(col[i] for col in call.args) for i in present]

    def picked(chosen: np.ndarray) -> Call:
        """The step's question over these of the cascade's rows."""
        return Call(call.question, [[col[i] for i in present[chosen]] for col in call.args], call.selectivity)

    def embed(chosen: np.ndarray) -> np.ndarray:
        """The embeddings of these rows' documents (zeros where a text has none: an empty one)."""
        vectors = runtime.embeddings.embed([texts[i] for i in chosen], work.check if work is not None else None)
        return np.stack([v if v is not None else np.zeros(runtime.embeddings.dims, np.float32) for v in vectors])

    cascade = _CASCADES[step.kind]
    answers = np.full(rows.num_rows, cascade.none, object)
    if len(present):
        key = _key(call, texts)
        known = runtime.memo.get(f"cascade {step.kind} ".encode() + key, lambda: cascade.nothing(len(present)))
        placed: list[dict] = []  # the report's stage among the query's, once added

        def reported(report: Accounting) -> None:
            """The report as the query's stage: added once the thresholds are set, replaced whole (a reader
            of the running query's stages never sees half of it) when the cascade ends."""
            if work is None:
                return
            stage = {"operator": "ai_cascade", "output": step.output, **report.figures(), "line": report.describe()}
            if placed:
                work.stages[next(i for i, s in enumerate(work.stages) if s is placed[0])] = stage
            else:
                work.stages.append(stage)
            placed[:] = [stage]

        chosen, report = cascade.run(step, len(present), lambda rows_: cascade.ask(runtime, step, picked(rows_), work),
                                     embed, np.random.default_rng(int.from_bytes(key[:8], "little")), known, reported)
        reported(report)
        answers[present] = cascade.values(step, chosen)
    return answered(step, rows, call, pa.array(answers.tolist(), KINDS[step.kind].value or pa.bool_()), work)


@dataclass(frozen=True)
class _Cascade:
    """How a kind's cascade asks the model, runs, and turns its choices into the step's values."""

    none: object  # a row's value where an argument is NULL
    nothing: Callable[[int], Known]
    ask: Callable[[Runtime, AIStep, Call, QueryWork | None], np.ndarray]
    run: Callable[..., tuple[np.ndarray, object]]
    values: Callable[[AIStep, np.ndarray], np.ndarray]


def _yes(runtime: Runtime, step: AIStep, asked: Call, work: QueryWork | None) -> np.ndarray:
    """The model's yes per row."""
    operator = of(step.kind)
    return operator.kept(asking_together(runtime, [operator.ask(asked)], work).read()[0])


def _categories(runtime: Runtime, step: AIStep, asked: Call, work: QueryWork | None) -> np.ndarray:
    """The model's category per row, as its index among the step's labels."""
    index = {label: k for k, label in enumerate(step.labels)}
    return np.array([index[label] for label in of(step.kind).answer(runtime, asked, work).to_pylist()], np.int32)


_CASCADES = {
    "filter": _Cascade(False, Known.nothing, _yes,
                       lambda step, n, ask, embed, rng, known, decided: run(n, step.targets, ask, embed, rng, known,
                                                                            decided),
                       lambda step, kept: kept),
    "classify": _Cascade(None, lambda n: Known.nothing(n, np.int32), _categories,
                         lambda step, n, ask, embed, rng, known, decided: classify_cascade(
                             n, len(step.labels), step.targets, ask, embed, rng, known, decided),
                         lambda step, labels: np.array(step.labels, object)[labels]),
}
