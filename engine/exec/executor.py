"""Runs a physical plan: sequences its steps (relational ones in DuckDB, AI ones by ai_step.py and ai_chain.py)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import pyarrow as pa

from quail.engine.ai.aggregate import aggregate
from quail.engine.exec.ai_chain import ai_chain
from quail.engine.exec.ai_cascade import ai_cascade
from quail.engine.exec.ai_step import ai_step, asking_together, asks_yes_no, record
from quail.engine.exec.catalog import Catalog
from quail.engine.exec.plan import AIAggregate, AIFilterChain, AIStep, JoinChoice, PhysicalPlan, SQLStep, Step
from quail.engine.exec.relational import DuckDB, StatementSchemas
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.embeddings import EmbeddingCounts
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.runtime import Runtime
from quail.engine.runtime.estimates import CHUNK_ROWS, PROBE_ROWS



ANALYZE_SCHEMA = pa.schema([("plan", pa.string())])


@contextmanager
def statements(catalog: Catalog, work: QueryWork | None, runtime: Runtime | None) -> Iterator[DuckDB]:
    """A query's DuckDB statements on the catalog's connection: the functions DuckDB runs for them (a
    similarity join's pairs) stop when `work` does (the runtime's embeddings hold it: query_work.Works)."""
    with catalog.connection() as con, DuckDB(work, con, runtime.embeddings.works if runtime else None) as db:
        yield db


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
    with statements(catalog, work, runtime) as db:
        return analyze(plan, relations, db, runtime, work, sol)


def run_steps(plan: PhysicalPlan, catalog: Catalog, runtime: Runtime | None,
              work: QueryWork | None = None) -> dict[str, pa.Table]:
    """Every relation the plan's steps make, by name (its result among them)."""
    relations = catalog.relations(plan.tables)
    work = work if work is not None else QueryWork()
    with statements(catalog, work, runtime) as db:
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
        with statements(catalog, work, runtime) as db:
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
    with statements(catalog, work, runtime) as db:
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
                return asking_together([(first, chunk[first.input])], runtime, work)

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
        run = ai_step if step.targets is None else ai_cascade
        self.relations[step.output] = run(step, self.relations[step.input], self.runtime, self.work)

    def ai_chain(self, step: AIFilterChain) -> None:
        self.relations[step.output] = ai_chain(step, self.relations[step.input], self.runtime, self.work)

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
                    record(self.work, {"operator": "ai_aggregate", "output": step.output, "rows_in": len(lists)})
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
        embedded = runtime.embeddings.counts() if runtime is not None else None
        _run_step(step, relations, db, runtime, work)
        done = work.stats.minus(before)
        prompts = done.prompt_tokens
        cached = f", {done.cached_tokens:,} of {prompts:,} prompt tokens cached{_restored(done)}" if prompts else ""
        if embedded is not None:
            cached += _embedded(runtime.embeddings.counts().minus(embedded))
        first, *rest = step.describe()
        lines += [f"{first}  [{relations[step.output].num_rows} rows, {time.perf_counter() - begun:.3f}s{cached}]",
                  *rest]
    wall = time.perf_counter() - started
    for stage in work.stages:
        if stage["operator"] == "join_order":
            lines.append(f"stage join_order -> {stage['output']}: cores of {stage['rows']} rows, joined in the "
                         f"order {', '.join(stage['chosen'])} (planned: {', '.join(stage['planned'])})")
            continue
        if "line" in stage:
            lines.append(f"stage {stage['operator']} -> {stage['output']}: {stage['line']}")
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


def _embedded(counts: EmbeddingCounts) -> str:
    """The texts the server's embedding model was asked for during a step (EXPLAIN ANALYZE; the server's
    counts: another statement embedding at the same time adds to them)."""
    if not (counts.computed or counts.cached or counts.skipped):
        return ""
    return (f", texts embedded: {counts.computed:,} computed, {counts.cached:,} kept from before, "
            f"{counts.skipped:,} NULL")


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
        return asks_yes_no(step)

    def ai_chain(self, step: AIFilterChain) -> bool:
        return False

    def join_choice(self, step: JoinChoice) -> bool:
        return False

    def ai_aggregate(self, step: AIAggregate) -> bool:
        return False


_ASKS_YES_NO = _AsksYesNo()


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
