"""Runs a physical plan: relational steps in DuckDB, AI steps through the runtime."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quail.engine.ai.aggregate import aggregate
from quail.engine.ai.completion import complete
from quail.engine.ai.kinds import KINDS, answered_yes
from quail.engine.ai.operators import Ask, Question, asking_together, classify
from quail.engine.exec.catalog import Catalog
from quail.engine.exec.plan import (AIAggregate, AIFilterChain, AIStep, JoinChoice, PhysicalPlan, SQLStep, Step,
                                   filter_rank)
from quail.engine.exec.relational import DuckDB, StatementSchemas
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.runtime import Runtime
from quail.engine.runtime.estimates import CHARS_PER_TOKEN, CHUNK_ROWS, PROBE_ROWS



ANALYZE_SCHEMA = pa.schema([("plan", pa.string())])


def execute(plan: PhysicalPlan, catalog: Catalog, runtime: Runtime | None, work: QueryWork | None = None,
            sol: Callable[[Stats], float | None] | None = None) -> pa.Table:
    """All steps in order, on the catalog's connection; the final relation's rows. Model work is recorded in
    `work`.

    An analyze plan returns what each step did instead (`analyze`); `sol` gives
    the speed-of-light seconds of the ideal work, where the caller knows the device.
    """
    if not plan.analyze:
        return run_steps(plan, catalog, runtime, work)[plan.result]
    relations = catalog.relations(plan.tables)
    work = work if work is not None else QueryWork()
    with catalog.connection() as con, DuckDB(work, con) as db:
        return analyze(plan, relations, db, runtime, work, sol)


def run_steps(plan: PhysicalPlan, catalog: Catalog, runtime: Runtime | None,
              work: QueryWork | None = None) -> dict[str, pa.Table]:
    """Every relation the plan's steps make, by name (its result among them)."""
    relations = catalog.relations(plan.tables)
    work = work if work is not None else QueryWork()
    with catalog.connection() as con, DuckDB(work, con) as db:
        for step in plan.steps:
            _run_step(step, relations, db, runtime, work)
    return relations


def execute_stream(plan: PhysicalPlan, catalog: Catalog, runtime: Runtime | None, work: QueryWork | None = None,
                   sol: Callable[[Stats], float | None] | None = None,
                   rows_per_batch: int = 65536) -> Iterator[pa.RecordBatch]:
    """The result's batches as they are produced: a plan of one DuckDB statement (no AI work) streams
    from DuckDB; a chunked plan yields each chunk's rows once its model work is done; any other runs
    its steps, then yields the final relation batch by batch."""
    if not plan.analyze and len(plan.steps) == 1 and isinstance(plan.steps[0], SQLStep):
        step = plan.steps[0]
        with catalog.connection() as con, DuckDB(work, con) as db:
            yield from db.stream(step.sql, catalog.relations(plan.tables), rows_per_batch, step.params)
    elif not plan.analyze and plan.chunked:
        for chunk in _chunks(plan, catalog, runtime, work):
            yield from chunk.to_batches(max_chunksize=rows_per_batch)
    else:
        yield from execute(plan, catalog, runtime, work, sol).to_batches(max_chunksize=rows_per_batch)


def _chunks(plan: PhysicalPlan, catalog: Catalog, runtime: Runtime | None,
            work: QueryWork | None) -> Iterator[pa.Table]:
    """The result of a chunked plan, chunk by chunk: the leading SQL steps once, then the rest over
    consecutive slices of their output, each twice the last (up to CHUNK_ROWS[1]).

    Where the first of the rest asks a yes/no question of each row (a filter, a score) and there are several
    chunks, each chunk's forward passes are queued, on a thread, while the chunk before is read, finished and
    streamed: the device goes from one chunk's passes to the next without waiting for the host. A query that
    stops early (an error, or its reader gone) is cancelled, so the chunk being queued leaves the device at
    its next pass."""
    relations = catalog.relations(plan.tables)
    work = work if work is not None else QueryWork()
    lead = next(i for i, step in enumerate(plan.steps) if not isinstance(step, SQLStep))
    first, rest = plan.steps[lead], plan.steps[lead + 1:]
    with catalog.connection() as con, DuckDB(work, con) as db:
        for step in plan.steps[:lead]:
            _run_step(step, relations, db, runtime, work)
        source = plan.steps[lead - 1].output
        rows = relations[source]
        chunks = [{**relations, source: rows.slice(start, size)} for start, size in _slices(rows.num_rows)]
        if runtime is None or len(chunks) < 2 or not first.visit(_ASKS_YES_NO):  # nothing to queue beside
            for chunk in chunks:
                for step in plan.steps[lead:]:
                    _run_step(step, chunk, db, runtime, work)
                yield chunk[plan.result]
            return
        with ThreadPoolExecutor(1, thread_name_prefix="quail-chunks") as launcher:
            def launched(chunk: dict[str, pa.Table]) -> Callable[[], list[pa.Table]]:
                work.check()
                return _asking_together([(first, chunk[first.input])], runtime, work)

            coming = launcher.submit(launched, chunks[0])
            try:
                for k, chunk in enumerate(chunks):
                    answered = coming.result()
                    if k + 1 < len(chunks):
                        coming = launcher.submit(launched, chunks[k + 1])
                    chunk[first.output] = answered()[0]
                    for step in rest:
                        _run_step(step, chunk, db, runtime, work)
                    yield chunk[plan.result]
            finally:
                if not coming.done():
                    work.cancel()
                coming = None  # its error's traceback holds this frame: no cycle through it


def _slices(rows: int) -> list[tuple[int, int]]:
    """(start, size) of a chunked plan's chunks over `rows` rows: CHUNK_ROWS[0] first, each twice the last up
    to CHUNK_ROWS[1].

    >>> _slices(1000)
    [(0, 64), (64, 128), (192, 256), (448, 512), (960, 1024)]
    """
    out, start, size = [], 0, CHUNK_ROWS[0]
    while start < rows:
        out.append((start, size))
        start, size = start + size, min(2 * size, CHUNK_ROWS[1])
    return out


def result_schema(plan: PhysicalPlan, catalog: Catalog, work: QueryWork | None = None,
                  schemas: StatementSchemas | None = None) -> pa.Schema:
    """The result schema (empty_relations: no model work, no DuckDB statement run)."""
    if plan.analyze:
        return ANALYZE_SCHEMA
    return empty_relations(plan, catalog, work, schemas)[plan.result].schema


def empty_relations(plan: PhysicalPlan, catalog: Catalog, work: QueryWork | None = None,
                    schemas: StatementSchemas | None = None) -> dict[str, pa.Table]:
    """Every relation the plan's steps make, empty, found by running them over empty relations: each DuckDB
    statement bound, not run (its output schema taken from `schemas` where it was bound over relations of the
    same schemas and the same catalog version before); DuckDB's binding of the others stops when `work` is
    cancelled or passes its deadline."""
    relations = {name: table.schema.empty_table() for name, table in catalog.relations(plan.tables).items()}
    with catalog.connection() as con, DuckDB(work, con) as db:
        run = _OverEmpty(relations, db, None, None, schemas or StatementSchemas(), catalog.version)
        for step in plan.steps:
            step.visit(run)
    return relations


def _run_step(step: Step, relations: dict[str, pa.Table], db: DuckDB, runtime: Runtime | None,
              work: QueryWork | None) -> None:
    if work is not None:
        work.check()
    step.visit(_Run(relations, db, runtime, work))


@dataclass
class _Run:
    """Runs each kind of step: its output joins the relations."""

    relations: dict[str, pa.Table]
    db: DuckDB
    runtime: Runtime | None
    work: QueryWork | None

    def sql_step(self, step: SQLStep) -> None:
        picked = step.picked(self.relations)
        self.relations[step.output] = picked if picked is not None else self.db.run(step.sql, self.relations,
                                                                                     step.params)

    def ai_step(self, step: AIStep) -> None:
        self.relations[step.output] = _ai_step(step, self.relations[step.input], self.runtime, self.work)

    def ai_chain(self, step: AIFilterChain) -> None:
        self.relations[step.output] = _ai_chain(step, self.relations[step.input], self.runtime, self.work)

    def join_choice(self, step: JoinChoice) -> None:
        _join_choice(step, self.relations, self.db, self.runtime, self.work)

    def ai_aggregate(self, step: AIAggregate) -> None:
        """Each group's answer; NULL for a group of no texts (a whole table's aggregate over no rows, as the
        result's schema is found, asks nothing)."""
        rows = self.relations[step.input]
        for column, aggregation in step.columns:
            lists = rows.column(column).to_pylist()
            if not any(text is not None for texts in lists if texts for text in texts):
                answers: list[str | None] = [None] * len(lists)
            elif self.runtime is None:
                raise RuntimeError("an AI step over rows needs a runtime")
            else:
                answers = aggregate(self.runtime, aggregation, lists, self.work)
                if self.work is not None:
                    _record(self.work, {"operator": "ai_aggregate", "output": step.output, "rows_in": len(lists)})
            rows = rows.set_column(rows.schema.get_field_index(column), column, pa.array(answers, pa.string()))
        self.relations[step.output] = rows


def analyze(plan: PhysicalPlan, relations: dict[str, pa.Table], db: DuckDB, runtime: Runtime | None,
            work: QueryWork, sol: Callable[[Stats], float | None] | None) -> pa.Table:
    """Run the plan; a line per step with its rows and seconds (and, where it asked the model, how many of its
    prompts' tokens were cached: not computed), then the AI stages and the model work."""
    lines = [f"note: {note}" for note in plan.notes]
    started = time.perf_counter()
    for step in plan.steps:
        begun, before = time.perf_counter(), replace(work.stats)
        _run_step(step, relations, db, runtime, work)
        done = work.stats.minus(before)
        prompts = done.prompt_tokens
        cached = f", {done.cached_tokens:,} of {prompts:,} prompt tokens cached{_restored(done)}" if prompts else ""
        first, *rest = step.describe()
        lines += [f"{first}  [{relations[step.output].num_rows} rows, {time.perf_counter() - begun:.3f}s{cached}]",
                  *rest]
    wall = time.perf_counter() - started
    for stage in work.stages:
        if stage["operator"] == "join_order":
            lines.append(f"stage join_order -> {stage['output']}: cores of {stage['rows']} rows, joined in the "
                         f"order {', '.join(stage['chosen'])} (planned: {', '.join(stage['planned'])})")
            continue
        if stage["operator"] == "ai_filter_rerank":
            lines.append(f"stage {stage['operator']} -> {stage['output']}: after {PROBE_ROWS} rows, "
                         f"{stage['order']} (observed {stage['selectivity_observed']})")
            continue
        observed = stage.get("selectivity_observed")
        lines.append(f"stage {stage['operator']} -> {stage['output']}: {stage['rows_in']} rows in"
                     + (f", {stage['rows_out']} out, selectivity {stage['selectivity_provided']:g} estimated, "
                        f"{observed:.3f} observed" if observed is not None else ""))
    report = work.report(wall, sol)
    lines.append(f"model: {report['requests']} requests, {report['logical_tokens']} logical tokens, "
                 f"{report['fresh_tokens']} fresh, {report['cached_tokens']} cached{_restored(work.stats)}, "
                 f"KV regret {report['kv_regret_tokens']}")
    sol_s, ideal = report["sol_s"], report["ideal"]["fresh_tokens"]
    spared = ideal - report["fresh_tokens"]  # tokens earlier queries' resident KV spared: the query beat its own ideal
    lines.append(f"wall {wall:.3f}s" + (f", speed of light {sol_s:.3f}s ({sol_s / wall:.2f} of wall)"
                                        if sol_s is not None and wall > 0 else "")
                 + (f"; the speed of light is of this query's ideal plan alone, {ideal:,} fresh tokens, of which KV "
                    f"that earlier queries left spared {spared:,}" if sol_s is not None and spared > 0 else ""))
    return pa.table({"plan": pa.array(lines, pa.string())})


def _restored(stats: Stats) -> str:
    """Where the cached tokens were copied back from, where any were (EXPLAIN ANALYZE)."""
    tiers = [f"{count:,} from {tier}" for count, tier in ((stats.host_restored_tokens, "host memory"),
                                                         (stats.disk_restored_tokens, "disk")) if count]
    return f" ({', '.join(tiers)})" if tiers else ""


def _join_choice(step: JoinChoice, relations: dict[str, pa.Table], db: DuckDB, runtime: Runtime | None,
                 work: QueryWork | None) -> None:
    """The join order the cores' observed rows make cheapest, then its steps."""
    rows = [relations[core].num_rows for core in step.cores]
    chosen = step.pick(rows)
    if work is not None:
        work.stages.append({"operator": "join_order", "output": step.output, "rows": rows,
                            "planned": list(step.orders[0]), "chosen": list(step.orders[chosen])})
    for sub in step.alternatives[chosen]:
        _run_step(sub, relations, db, runtime, work)


class _AsksYesNo:
    """Whether a step asks a yes/no question of each row (its passes may be queued before its answers are
    read: _asking_together)."""

    def sql_step(self, step: SQLStep) -> bool:
        return False

    def ai_step(self, step: AIStep) -> bool:
        return KINDS[step.kind].answer not in _ANSWERED_ALONE

    def ai_chain(self, step: AIFilterChain) -> bool:
        return False

    def join_choice(self, step: JoinChoice) -> bool:
        return False

    def ai_aggregate(self, step: AIAggregate) -> bool:
        return False


_ASKS_YES_NO = _AsksYesNo()


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


@dataclass
class _OverEmpty(_Run):
    """Runs a plan's steps over empty relations: its DuckDB statements' output schemas from `schemas`, bound over
    the catalog at `version`."""

    schemas: StatementSchemas
    version: int

    def sql_step(self, step: SQLStep) -> None:
        picked = step.picked(self.relations)
        self.relations[step.output] = (picked if picked is not None else self.schemas.output(
            self.db, step.sql, self.relations, self.version, step.params).empty_table())


def _ai_step(step: AIStep, rows: pa.Table, runtime: Runtime | None, work: QueryWork | None) -> pa.Table:
    answer = KINDS[step.kind].answer
    if answer not in _ANSWERED_ALONE:
        return _asked_together([(step, rows)], runtime, work)[0]
    if rows.num_rows and runtime is None:
        raise RuntimeError("an AI step over rows needs a runtime")
    answers = pa.array(_ANSWERED_ALONE[answer](runtime, step, _args(step, rows), work) if rows.num_rows else [],
                       pa.string())
    return _answered(step, rows, answers, work)


_ANSWERED_ALONE = {  # the kinds whose steps are not asked together with others: their answers, by how answered
    "category": lambda runtime, step, args, work: classify(runtime, _question(step), args, work),
    "text": lambda runtime, step, args, work: complete(runtime, _question(step), args, step.generation, work),
}


def _asked_together(steps: list[tuple[AIStep, pa.Table]], runtime: Runtime | None,
                    work: QueryWork | None) -> list[pa.Table]:
    """Each yes/no step's output over its rows (filters: the rows that pass), the model asked once for
    all of them (their passes shared)."""
    return _asking_together(steps, runtime, work)()


def _asking_together(steps: list[tuple[AIStep, pa.Table]], runtime: Runtime | None,
                     work: QueryWork | None) -> Callable[[], list[pa.Table]]:
    """As _asked_together, the passes queued now; what it returns reads the answers and gives the outputs."""
    asked = [_ask(step, rows, work) for step, rows in steps if rows.num_rows]
    if asked and runtime is None:
        raise RuntimeError("an AI step over rows needs a runtime")
    asking = asking_together(runtime, asked, work) if asked else None
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
        _record(work, stage)
    return out


def _record(work: QueryWork, stage: dict) -> None:
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


def _ai_chain(chain: AIFilterChain, rows: pa.Table, runtime: Runtime | None, work: QueryWork | None) -> pa.Table:
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
            chunk = _ai_step(step, chunk, runtime, work)
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
        sample = _ai_step(step, sample, runtime, work)
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
        passed = _asked_together([(filters[j], waiting[j]) for j in now], runtime, work)
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
