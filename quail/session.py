"""The in-process Python API: register tables, run AI-SQL, read rows and a report of the work.

    import quail
    with quail.Session(quail.EngineConfig()) as session:
        session.register("reviews", quail.DocumentProvider.from_table(table, id_col="id"))
        result = session.sql("SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} kind?', body))").run()
        rows, report = result.to_rows(), result.report

The same query service (server/query_service.py) plans and runs the Flight SQL server's statements.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import pyarrow as pa

from quail.engine.errors import InvalidArgument
from quail.engine.exec import embedding_functions
from quail.engine.exec.catalog import MemoryCatalog
from quail.engine.exec.plan import PhysicalPlan
from quail.engine.exec.relational import memory_database
from quail.engine.model.config import EngineConfig
from quail.engine.runtime.loading import settled
from quail.engine.runtime.serving import serve_runtime
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.runtime import Runtime
from quail.planner.dialects import DEFAULT_DIALECT
from quail.planner.explain import explain_lines
from quail.planner.substrait.consumer import QUERY_TEXT
from quail.remote import RemoteSession
from quail.results import DocumentProvider, Report, Result
from quail.server.query_service import QueryService


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

    - `Session(config, endpoint="grpc://host:port")` is the same calls on a Quail server instead
      (a `quail.RemoteSession`; the server's flags are its engine's config, so `config` must be left
      at its defaults there).
    """

    def __new__(cls, config: EngineConfig | None = None, runtime: Runtime | None = None,
                endpoint: str | None = None) -> "Session | RemoteSession":
        if endpoint is None:
            return super().__new__(cls)
        if runtime is not None or (config is not None and config != EngineConfig()):
            raise InvalidArgument("a remote session runs on the server's engine: its config is the server's "
                                  "(quail serve's flags), not the session's")
        return RemoteSession(endpoint)

    def __init__(self, config: EngineConfig | None = None, runtime: Runtime | None = None,
                 endpoint: str | None = None) -> None:
        self.config = settled(config or EngineConfig())
        owned = runtime is None
        self.runtime = runtime or serve_runtime(self.config)
        self._replicas = self.runtime.replicas if owned else None  # stopped by close
        self.service = QueryService.serving(self.runtime, self.config)
        self.catalog = MemoryCatalog()
        embedding_functions.register(memory_database(), self.runtime.embeddings)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Drop the registered tables; stop the runtime's replica processes where this session started them."""
        self.catalog = MemoryCatalog()
        if self._replicas is not None:
            self._replicas.stop()

    def register(self, name: str, source: DocumentProvider | pa.Table, replace: bool = False) -> None:
        table = source.table if isinstance(source, DocumentProvider) else source
        self.catalog.register(name, table, replace)

    def sql(self, text: str, dialect: str = DEFAULT_DIALECT, params: list[Any] | None = None) -> Query:
        """A query; `params` bind its `?` placeholders in order (it runs only with them bound)."""
        plan, schema = self.service.plan_query(text, self.catalog, dialect, params)
        return Query(self, text, plan, schema, bound=params is not None or not plan.parameters)

    def substrait(self, text: str, dialect: str = DEFAULT_DIALECT, params: list[Any] | None = None) -> bytes:
        """The query's optimized plan as a serialized Substrait plan (`EXPLAIN (FORMAT SUBSTRAIT)` returns it too)."""
        return self.service.substrait(text, self.catalog, dialect, params)

    def execute_substrait(self, plan: bytes) -> Result:
        """Run a serialized Substrait plan over the registered tables: one `substrait` made, or one written
        by hand within the same subset (AI work as calls of Quail's AI extension functions)."""
        return Query(self, QUERY_TEXT, *self.service.plan_substrait(plan, self.catalog)).run()

    def _run(self, query: Query) -> Result:
        if not query.bound:
            raise InvalidArgument(f"the query has {query.plan.parameters} parameter(s) and no values were bound")
        work = QueryWork()
        started = time.perf_counter()
        table = self.service.execute(query.plan, self.catalog, work)
        report = Report(**self.service.report(work, time.perf_counter() - started))
        return Result(table.cast(query.schema), report)
