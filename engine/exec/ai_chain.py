"""An AI filter chain's execution: several filters over one relation, under a LIMIT or reranked as rows pass.

- With a limit: chunks of rows through every filter, each chunk twice the last, until enough passed.
- Without: a probe of the first rows in plan order, then the rest in the order their observed
  selectivities rank best, pipelined so a later filter's rows ride in the passes of a part's documents.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quail.engine.exec.ai_step import ai_step, asked_together
from quail.engine.exec.plan import AIFilterChain, AIStep, filter_rank
from quail.engine.runtime.estimates import CHARS_PER_TOKEN, PROBE_ROWS
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.runtime import Runtime


def ai_chain(chain: AIFilterChain, rows: pa.Table, runtime: Runtime | None, work: QueryWork | None) -> pa.Table:
    """Filter chunks of rows through every filter until `limit` rows have passed (all rows: _reranked)."""
    if chain.limit is None:
        return _reranked(chain, rows, runtime, work)
    expected = float(np.prod([f.selectivity for f in chain.filters]))
    size = max(chain.limit, int(np.ceil(1.5 * chain.limit / expected)))
    kept: list[pa.Table] = []
    start, passed = 0, 0
    while True:
        chunk = rows.slice(start, size)
        for step in chain.filters:
            chunk = ai_step(step, chunk, runtime, work)
        kept.append(chunk)
        passed += chunk.num_rows
        start += size
        if passed >= chain.limit or start >= rows.num_rows:
            break
        size *= 2
    out = pa.concat_tables(kept) if len(kept) > 1 else kept[0]
    return out.slice(0, chain.limit)


def _reranked(chain: AIFilterChain, rows: pa.Table, runtime: Runtime | None, work: QueryWork | None) -> pa.Table:
    """The first PROBE_ROWS rows through the filters in plan order; the rest in the order their observed
    selectivities rank best, in parts pipelined through the filters: each model call asks the first
    filter about a new part, the second about the last part's rows that passed the first, and so on,
    so a later filter's few rows ride in the passes of a part's documents instead of passes of their
    own. Parts are sized so the KV pool holds the documents of every part in flight (each later
    filter continues them). A row passes when every filter keeps it, in either order."""
    sample, observed = rows.slice(0, PROBE_ROWS), []
    for step in chain.filters:
        asked = sample.num_rows
        sample = ai_step(step, sample, runtime, work)
        observed.append(sample.num_rows / asked if asked else step.selectivity)
    order = sorted(range(len(chain.filters)), key=lambda i: filter_rank(chain.filters[i].template, observed[i]))
    if work is not None and order != sorted(order):
        work.stages.append({"operator": "ai_filter_rerank", "output": chain.output,
                            "order": [chain.filters[i].template for i in order],
                            "selectivity_observed": [round(observed[i], 4) for i in order]})
    filters = [chain.filters[i] for i in order]
    rest, kept = rows.slice(PROBE_ROWS), [sample]
    in_flight = sum(float(np.prod([observed[i] for i in order[:j]])) for j in range(len(order)))
    cached = _cached_rows(filters[0], rest, runtime) if len(order) > 1 else None
    size = max(1, int(cached / in_flight)) if cached else max(rest.num_rows, 1)
    parts = [rest.slice(start, size) for start in range(0, rest.num_rows, size)]
    waiting: list[pa.Table | None] = [None] * len(filters)  # rows waiting for each filter
    for turn in range(len(parts) + len(filters) - 1 if parts else 0):
        waiting[0] = parts[turn] if turn < len(parts) else None
        now = [j for j, part in enumerate(waiting) if part is not None]
        passed = asked_together([(filters[j], waiting[j]) for j in now], runtime, work)
        waiting = [None] * len(filters)
        for j, part in zip(now, passed):
            if j + 1 < len(filters):
                waiting[j + 1] = part
            else:
                kept.append(part)
    return pa.concat_tables(kept)


def _cached_rows(step: AIStep, rows: pa.Table, runtime: Runtime | None) -> int | None:
    """Rows whose documents the KV pool holds at once (None: nothing is kept), their length estimated from
    the first document's characters."""
    if runtime is None or not rows.num_rows:
        return None
    chars = pc.mean(pc.utf8_length(rows.column(step.arg_columns[step.anchor]).cast(pa.string()))).as_py()
    return runtime.rows_cached((chars or 0) / CHARS_PER_TOKEN)
