"""The in-process Python API: register tables, run AI-SQL, read rows and a report of the work.

    import quail
    with quail.Session(quail.EngineConfig()) as session:
        session.register("reviews", quail.DocumentProvider.from_table(table, id_col="id"))
        result = session.sql("SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} kind?', body))").run()
        rows, report = result.to_rows(), result.report

The same planner, executor and runtime serve the Flight SQL server.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from quail.engine.catalog import MemoryCatalog
from quail.engine.config import EngineConfig
from quail.engine.errors import InvalidArgument
from quail.engine.executor import execute, result_schema
from quail.engine.models import load_runtime
from quail.engine.physical import PhysicalPlan
from quail.engine.runtime import Runtime
from quail.engine.stats import Stats
from quail.engine.work import QueryWork
from quail.planner.cost import DEVICES, rank_by_sol, sol_seconds
from quail.planner.dialects import DEFAULT_DIALECT
from quail.planner.explain import explain_lines
from quail.planner.planner import plan_sql
from quail.planner.substrait_export import export_plan
from quail.planner.substrait_import import QUERY_TEXT, import_plan


class DocumentProvider:
    """A table of documents: an id column and text columns the prompts refer to."""

    def __init__(self, table: pa.Table, id_col: str | None = None) -> None:
        if id_col is not None and id_col not in table.column_names:
            raise InvalidArgument(f"id column {id_col!r} is not among {table.column_names}")
        self.table = table
        self.id_col = id_col

    @classmethod
    def from_table(cls, table: pa.Table, id_col: str | None = None) -> "DocumentProvider":
        return cls(table, id_col)

    @classmethod
    def from_parquet(cls, path: str | Path, id_col: str | None = None) -> "DocumentProvider":
        return cls(pq.read_table(path), id_col)

    @classmethod
    def from_ipc(cls, path: str | Path, id_col: str | None = None) -> "DocumentProvider":
        with pa.memory_map(str(path)) as source:
            return cls(ipc.open_file(source).read_all(), id_col)


@dataclass
class Report:
    """What a query cost: wall time, tokens asked and computed, and its speed of light."""

    wall_s: float
    logical_tokens: int
    fresh_tokens: int
    cached_tokens: int
    padded_tokens: int
    physical_tokens: int
    kv_regret_tokens: int
    requests: int
    forward_passes: int
    stages: list[dict[str, Any]]
    ideal: dict[str, int]
    sol_s: float | None

    @property
    def sol_fraction(self) -> float | None:
        return self.sol_s / self.wall_s if self.sol_s is not None and self.wall_s > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "sol_fraction": self.sol_fraction}


@dataclass
class Result:
    """Rows of a finished query and its report."""

    table: pa.Table
    report: Report

    def collect(self) -> pa.Table:
        return self.table

    def to_rows(self) -> list[dict[str, Any]]:
        return self.table.to_pylist()

    def count(self) -> int:
        return self.table.num_rows

    @property
    def schema(self) -> pa.Schema:
        return self.table.schema


@dataclass
class Query:
    """A planned query: explain it, or run it."""

    session: "Session"
    text: str
    plan: PhysicalPlan
    schema: pa.Schema = field(repr=False)
    bound: bool = True  # False: the text has `?` placeholders and no values were given (explain only)

    def explain(self) -> str:
        """The plan, a line per step (the rows `EXPLAIN <query>` returns), after the result's columns."""
        return "\n".join([f"result {self.plan.result}: {', '.join(self.schema.names)}", *explain_lines(self.plan)])

    def run(self) -> Result:
        return self.session._run(self)

    def collect(self) -> pa.Table:
        return self.run().collect()

    def execute_stream(self) -> Iterator[pa.RecordBatch]:
        """The result's record batches."""
        yield from self.run().table.to_batches()


class Session:
    """Tables registered in memory and one model runtime; a context manager.

    `Session(endpoint="grpc://host:port")` is a session on a Quail server
    instead (quail.remote.RemoteSession): the same calls, run there.
    """

    def __new__(cls, config: EngineConfig | None = None, runtime: Runtime | None = None,
                endpoint: str | None = None):
        if endpoint is not None:
            from quail.remote import RemoteSession

            return RemoteSession(endpoint)
        return super().__new__(cls)

    def __init__(self, config: EngineConfig | None = None, runtime: Runtime | None = None,
                 endpoint: str | None = None) -> None:
        self.config = config or EngineConfig()
        self.runtime = runtime or load_runtime(self.config)
        self.catalog = MemoryCatalog()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.catalog = MemoryCatalog()

    def register(self, name: str, source: DocumentProvider | pa.Table, replace: bool = False) -> None:
        table = source.table if isinstance(source, DocumentProvider) else source
        self.catalog.register(name, table, replace)

    def sql(self, text: str, dialect: str = DEFAULT_DIALECT, params: list[Any] | None = None) -> Query:
        """A query; `params` bind its `?` placeholders in order (it runs only with them bound)."""
        query = self._query(text, plan_sql(text, self.catalog, dialect, params, rank=rank_by_sol(self._sol)))
        query.bound = params is not None or not query.plan.parameters
        return query

    def substrait(self, text: str, dialect: str = DEFAULT_DIALECT, params: list[Any] | None = None) -> bytes:
        """The query's optimized plan as a serialized Substrait plan (`EXPLAIN (FORMAT SUBSTRAIT)` returns it too)."""
        plan = plan_sql(text, self.catalog, dialect, params, rank=rank_by_sol(self._sol))
        return export_plan(plan, self.catalog).SerializeToString()

    def execute_substrait(self, plan: bytes) -> Result:
        """Run a serialized Substrait plan over the registered tables: one `substrait` made, or one written
        by hand within the same subset (AI work as calls of Quail's AI extension functions)."""
        return self._query(QUERY_TEXT, import_plan(plan, self.catalog)).run()

    def _query(self, text: str, plan: PhysicalPlan) -> Query:
        return Query(self, text, plan, result_schema(plan, self.catalog))

    def _sol(self, ideal: Stats) -> float | None:
        """Speed-of-light seconds of the ideal work on the configured device (None: no device constants)."""
        device = self.config.speed_of_light_device
        return (sol_seconds(ideal, self.runtime.config, DEVICES[device], self.config.precision, self.config.token_budget)
                if device else None)

    def _run(self, query: Query) -> Result:
        if not query.bound:
            raise InvalidArgument(f"the query has {query.plan.parameters} parameter(s) and no values were bound")
        work = QueryWork()
        started = time.perf_counter()
        table = execute(query.plan, self.catalog, self.runtime, work, self._sol)
        report = Report(**work.report(time.perf_counter() - started, self._sol))
        return Result(table.cast(query.schema), report)
