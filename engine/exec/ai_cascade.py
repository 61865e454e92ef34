"""A cascade's execution: an AI filter with recall / precision targets, the model asked only where a proxy cannot.

- The rows with no NULL argument are the cascade's rows (a NULL argument answers neither: the row is not kept).
- engine/ai/cascade.py draws the sample, fits the proxy on the embeddings of each row's documents (the
  server's embedding model, as AI_EMBED's), chooses the thresholds, and asks the model about the sample,
  then the band between the thresholds: the filter's own question, one call each.
- The sample's seed is fixed by the question and the rows' documents: the same query over the same rows
  keeps the same rows. What a cascade learned (answers, the proxy's scores) is kept in the runtime's memo
  under the same key, so a later cascade of that question over those rows (other targets too) asks the
  model only about rows none asked before; a changed row changes the key.
- Its stages: the filter's (rows in, rows out) and the cascade's report (its figures, and its line of EXPLAIN
  ANALYZE), which the server's metrics count.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa

from quail.engine.ai.asking import asking_together
from quail.engine.ai.cascade import Known, run
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
    """The rows the cascade keeps, in their order."""
    if rows.num_rows and runtime is None:
        raise RuntimeError("an AI step over rows needs a runtime")
    call, operator = call_of(step, rows), of(step.kind)
    present = np.array([i for i in range(rows.num_rows) if all(col[i] is not None for col in call.args)], np.int64)
    texts = ["\n".join(col[i] for col in call.args) for i in present]

    def ask(chosen: np.ndarray) -> np.ndarray:
        """The model's yes for these of the cascade's rows."""
        picked = Call(call.question, [[col[i] for i in present[chosen]] for col in call.args], call.selectivity)
        return operator.kept(asking_together(runtime, [operator.ask(picked)], work).read()[0])

    def embed(chosen: np.ndarray) -> np.ndarray:
        """The embeddings of these rows' documents (zeros where a text has none: an empty one)."""
        vectors = runtime.embeddings.embed([texts[i] for i in chosen])
        return np.stack([v if v is not None else np.zeros(runtime.embeddings.dims, np.float32) for v in vectors])

    yes = np.zeros(rows.num_rows, bool)
    if len(present):
        key = _key(call, texts)
        known = runtime.memo.get(b"cascade " + key, lambda: Known.nothing(len(present)))
        seed = int.from_bytes(key[:8], "little")
        kept, report = run(len(present), step.targets, ask, embed, np.random.default_rng(seed), known)
        yes[present[kept]] = True
        if work is not None:
            work.stages.append({"operator": "ai_cascade", "output": step.output, **report.figures(),
                                "line": report.describe()})
    return answered(step, rows, call, pa.array(yes), work)
