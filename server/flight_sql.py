"""Flight SQL semantics over the Flight service: commands, tickets, prepared statements, ingest."""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa
from google.protobuf.message import Message

from quail.engine.errors import Cancelled, InvalidArgument, NotFound, QuailError, Unimplemented
from quail.engine.exec.plan import PhysicalPlan, ai_steps
from quail.engine.exec.storage import TableStore
from quail.engine.runtime.query_work import QueryWork
from quail.planner.binder import CATALOG_NAME, SCHEMA_NAME, is_text
from quail.planner.dialects import DIALECTS
from quail.planner.substrait.consumer import QUERY_TEXT
from quail.planner.updates import UpdatePlan

from quail.server import metadata
from quail.server import sql_messages as sql
from quail.server.admission import Admission, Limits
from quail.server.auth import Access, user_of
from quail.server.flight_messages import (CANCEL_STATUS_CANCELLED, CANCEL_STATUS_CANCELLING,
                                          CANCEL_STATUS_NOT_CANCELLABLE, FLIGHT, parse)
from quail.server.ipc import plain_schema, schema_bytes
from quail.server.metrics import Metrics
from quail.server.query_service import QueryService
from quail.server.read_ahead import ReadAhead
from quail.server.session_options import LAST_QUERY, Sessions
from quail.server.statements import HeadStart, Planned, PreparedStatement, Statements
from quail.server.status import status_of
from quail.server.system_tables import QUERIES, QUERIES_SCHEMA, WithSystemTables, queries_table

log = logging.getLogger("quail.server")
BATCH_ROWS = 65536
WARM_ROWS = 1024  # rows of a text column the warming thread tokenizes at a time

_IF_EXISTS = {sql.TABLE_EXISTS_UNSPECIFIED: "fail", sql.TABLE_EXISTS_FAIL: "fail",
              sql.TABLE_EXISTS_APPEND: "append", sql.TABLE_EXISTS_REPLACE: "replace"}
_IF_MISSING = {sql.TABLE_NOT_EXIST_UNSPECIFIED: "fail", sql.TABLE_NOT_EXIST_CREATE: "create",
               sql.TABLE_NOT_EXIST_FAIL: "fail"}
_UPDATES = ("CommandStatementUpdate", "CommandPreparedStatementUpdate")
UPDATE_SCHEMA = pa.schema([pa.field("rows_affected", pa.int64(), nullable=False)])


class FlightSQLHandler:
    """Answers Flight SQL commands against one table store and one model runtime."""

    def __init__(self, store: TableStore, service: QueryService, dialect: str, limits: Limits = Limits(),
                 metrics: Metrics | None = None, access: Access = Access()) -> None:
        self.store = store
        self.service = service
        self.admission = Admission(limits.max_active)
        self.limits = limits
        self.metrics = metrics or Metrics(service.runtime.runner, service.runtime.replicas,
                                          service.runtime.texts)
        self.sessions = Sessions({"dialect": dialect, "catalog": CATALOG_NAME, "schema": SCHEMA_NAME},
                                 {"dialect": tuple(DIALECTS), "catalog": (CATALOG_NAME,), "schema": (SCHEMA_NAME,)})
        self.statements = Statements(limits.work)
        self.heads = ThreadPoolExecutor(limits.max_active, "quail-head")  # head starts' batches, made ahead
        self.warming = ThreadPoolExecutor(1, "quail-warm")  # tokenizing the texts of tables as they are written
        self.access = access
        self.catalog = self._system_tables("-", everyone=True)  # for planning: the tables and their schemas

    def cancel_all(self) -> None:
        """Cancel every running query and the warming not yet begun (the server is stopping)."""
        self.warming.shutdown(wait=False, cancel_futures=True)
        for running in self.statements.running().values():
            running.work.cancel()

    def warm(self, rows: pa.Table) -> None:
        """Tokenize the text columns of rows just stored, as documents, on the warming thread, WARM_ROWS at a
        time (Runtime.warm): the queries over them skip their tokenizing. Best effort, never the write's
        error: a failure is logged, and a server stopping warms nothing more."""
        texts = [c for c in rows.columns if is_text(c.type)]
        for column in texts:
            for start in range(0, len(column), WARM_ROWS):
                part = column.slice(start, WARM_ROWS)
                self.metrics.warming.inc(len(part))
                try:  # off the gauge once its task is done, whether it ran or was cancelled as the server stops
                    self.warming.submit(self._warm, part).add_done_callback(
                        lambda _, texts=len(part): self.metrics.warming.dec(texts))
                except RuntimeError:  # the warming thread was shut down: the server is stopping
                    self.metrics.warming.dec(len(part))
                    return

    def _warm(self, texts: pa.ChunkedArray) -> None:
        try:
            self.service.runtime.warm(texts)
        except Exception:
            log.exception("tokenizing a table's texts as it was written failed (its queries will tokenize them)")

    def _system_tables(self, viewer: str, everyone: bool) -> WithSystemTables:
        """The stored tables, and the system tables as a viewer sees them (`everyone`: every user's query
        text, else only the viewer's own)."""
        return WithSystemTables(self.store, {QUERIES: (QUERIES_SCHEMA, lambda: queries_table(
            self.statements.running(), viewer, everyone, self.service.runtime.runner.scheduler.place))})

    def _catalog(self, context) -> WithSystemTables:
        """The catalog a call's statement reads."""
        return self._system_tables(user_of(context), self.access.allows(context, "admin"))

    @staticmethod
    def _command(data: bytes, where: str) -> tuple[str, Message]:
        name, message = sql.unpack(data)
        if message is None:
            raise Unimplemented(f"{where}: unsupported command {name or '(not a Flight SQL command)'}")
        return name, message

    def _plan(self, query: str, params: list[pa.Scalar] | None, context,
              started: Callable[[PhysicalPlan], threading.Event | None] | None = None
              ) -> tuple[PhysicalPlan | UpdatePlan, pa.Schema]:
        """A query's plan and result schema; a CREATE / INSERT / DROP's plan, whose result is its row count.
        `params`: one row of bound parameter values; `started`: given a query's plan before its result schema
        is found, and may give back what finding it waits for (QueryService.plan)."""
        planning = self.limits.work()  # planning counts toward the query's time limit, and stops with its call
        context.add_callback(planning.cancel)
        plan, schema = self.service.plan(query, self.catalog, self.sessions.options(context)["dialect"], params,
                                         planning, started)
        return plan, UPDATE_SCHEMA if schema is None else plain_schema(schema)

    def _prepared_plan(self, statement: PreparedStatement,
                       context) -> tuple[PhysicalPlan | UpdatePlan, pa.Schema]:
        """A prepared statement's plan and schema for its bound parameters: the one made when it was
        prepared, while that holds (Planned.holds)."""
        planned = statement.planned
        if planned is not None and statement.params is None and \
                planned.holds(self.store.version, self.sessions.options(context)["dialect"]):
            return planned.plan, planned.schema
        return self._plan(statement.query, _first_row(statement.params), context)

    def _substrait(self, cmd: Message) -> tuple[PhysicalPlan, pa.Schema]:
        """A CommandStatementSubstraitPlan's plan and result schema."""
        plan, schema = self.service.plan_substrait(cmd.plan.plan, self.catalog)
        return plan, plain_schema(schema)

    def _stream(self, plan: PhysicalPlan | list[UpdatePlan], params: pa.Table | None,
                schema: Callable[[], pa.Schema], work: QueryWork, context, handle: bytes) -> Iterator[pa.RecordBatch]:
        """Run a query (its rows, batch by batch as produced) or an update (one row: the rows it wrote),
        admitted first; then its report (session option, metrics, log line). `schema` gives the result schema
        the batches are cast to (a head start's is found while it runs); `handle`: its running entry."""
        start, rows = time.perf_counter(), 0
        try:
            with self.admission.admit(), self.metrics.running.track_inprogress():
                catalog = self._catalog(context)
                if isinstance(plan, PhysicalPlan):
                    batches = self.service.stream(plan, catalog, work, BATCH_ROWS)
                else:
                    written = self._update(plan, params, work, catalog)
                    batches = iter(pa.table({"rows_affected": [written]}).to_batches())
                for batch in batches:
                    work.check()  # the client ended the call: stop reading
                    rows += batch.num_rows
                    yield batch.cast(schema())
        except QuailError as err:
            if isinstance(err, Cancelled):
                log.info("query cancelled after %.3fs, %d forward passes", time.perf_counter() - start,
                         work.stats.forward_passes)
            self.metrics.query_failed(status_of(err))
            raise
        finally:
            self.statements.finish(handle, work)
        report = self.service.report(work, time.perf_counter() - start)
        self.sessions.record(context, LAST_QUERY, json.dumps(report))
        self.metrics.query_done(report)
        log.info("query %s done for %s: %d rows in %.3fs, %d requests, %d logical / %d fresh tokens",
                 handle[:8].hex(), user_of(context), rows, report["wall_s"], report["requests"],
                 report["logical_tokens"], report["fresh_tokens"])

    def _update(self, updates: list[UpdatePlan], params: pa.Table | None, work: QueryWork,
                catalog: WithSystemTables) -> int:
        """Apply CREATE / INSERT / DROP to the store: one atomic commit; the rows written (0 for DROP).
        Several plans (one per row of parameters) are INSERTs into one table, written in one commit."""
        update = updates[0]
        table = catalog.writable(update.table)
        if update.query is None:
            self.store.drop(table, update.missing_ok)
            log.info("dropped table %s", table)
            return 0
        if update.if_exists == "keep" and self.store.has(table):
            return 0
        if update.rows_are_parameters and params is not None:
            rows = params
        else:
            rows = _stacked([self.service.execute(u.query, catalog, work) for u in updates])
        if update.if_exists == "append":
            rows = _as_columns_of(rows, self.store.schema(table).names, update.columns, table)
        written = self.store.write(table, rows, "fail" if update.if_exists == "keep" else update.if_exists,
                                   update.if_missing)
        self.warm(rows)
        log.info("%d rows written to %s", written, table)
        return written

    def _apply(self, query: str, first: UpdatePlan, params: pa.Table | None, context) -> pa.Table:
        """Run a statement that changes tables, once per row of parameters (INSERT only), as one commit; its
        result (one row: the rows it wrote). `first` is its plan for the first row of parameters."""
        self.access.require(context, "write", "change tables")
        updates = [first]
        if params is not None and params.num_rows > 1:
            if first.if_exists != "append":
                raise InvalidArgument("only INSERT takes several rows of parameters")
            if not first.rows_are_parameters:
                updates += [self._plan(query, row, context)[0] for row in _rows(params)[1:]]
        handle, work = self.statements.begin(query, user_of(context))
        context.add_callback(work.cancel)
        return pa.Table.from_batches(list(self._stream(updates, params, lambda: UPDATE_SCHEMA, work, context, handle)))

    @staticmethod
    def _info(descriptor, schema: pa.Schema, ticket: bytes) -> Message:
        endpoint = FLIGHT["FlightEndpoint"](ticket=FLIGHT["Ticket"](ticket=ticket))
        return FLIGHT["FlightInfo"](schema=schema_bytes(schema), flight_descriptor=descriptor,
                                    endpoint=[endpoint], total_records=-1, total_bytes=-1)

    def _statement_info(self, descriptor, query: str, params: pa.Table | None, context,
                        planned: tuple[PhysicalPlan | UpdatePlan, pa.Schema] | None = None,
                        head: bytes | None = None) -> Message:
        """FlightInfo of a statement. A query is planned here (unless `planned` gives its plan and schema)
        and runs when its ticket is redeemed (`head`: the handle of its head start, its ticket's); a
        statement that changes tables runs here, so it has taken effect when the client's execute() returns,
        whether or not the client fetches its result (the ticket then reads that result)."""
        plan, schema = planned or self._plan(query, _first_row(params), context)
        _check_bound(plan, params)
        if isinstance(plan, UpdatePlan):
            handle = self.statements.add_result(self._apply(query, plan, params, context))
        else:
            if params is not None and params.num_rows != 1:
                raise InvalidArgument(f"bind exactly one row of parameters to a query, not {params.num_rows}")
            handle = self.statements.add_pending(plan, schema, query, head)
        return self._info(descriptor, schema, sql.pack(sql.new("TicketStatementQuery", statement_handle=handle)))

    def _route(self, data: bytes, rpc: str) -> tuple[Callable, Message]:
        """The handler of a command (or ticket) for one RPC, from COMMANDS, and the command."""
        name, cmd = self._command(data, rpc)
        handler = getattr(COMMANDS.get(name), _RPC_FIELDS[rpc], None)
        if handler is None:
            raise Unimplemented(f"{rpc}: unsupported command {name}")
        return handler, cmd

    def get_flight_info(self, descriptor, context) -> Message:
        handler, cmd = self._route(descriptor.cmd, "GetFlightInfo")
        return handler(self, cmd, descriptor, context)

    def get_schema(self, descriptor, context) -> pa.Schema:
        handler, cmd = self._route(descriptor.cmd, "GetSchema")
        return handler(self, cmd, context)

    def do_get(self, ticket, context) -> tuple[pa.Schema, Iterable[pa.RecordBatch]]:
        handler, cmd = self._route(ticket.ticket, "DoGet")
        return handler(self, cmd, context)

    def _query_info(self, cmd: Message, descriptor, context) -> Message:
        return self._statement_info(descriptor, cmd.query, None, context)

    def _query_schema(self, cmd: Message, context) -> pa.Schema:
        return self._plan(cmd.query, None, context)[1]

    def _substrait_info(self, cmd: Message, descriptor, context) -> Message:
        plan, schema = self._substrait(cmd)
        handle = self.statements.add_pending(plan, schema, QUERY_TEXT)
        return self._info(descriptor, schema, sql.pack(sql.new("TicketStatementQuery", statement_handle=handle)))

    def _substrait_schema(self, cmd: Message, context) -> pa.Schema:
        return self._substrait(cmd)[1]

    def _prepared_info(self, cmd: Message, descriptor, context) -> Message:
        """A prepared statement's FlightInfo; its first names its head start, where the plan it ran still
        holds (else the head start stops)."""
        statement = self.statements.prepared(cmd.prepared_statement_handle)
        head = self.statements.take_head(statement)
        planned = self._prepared_plan(statement, context)
        if head is not None and planned[0] is not statement.planned.plan:
            self.statements.stop_head(head)
            head = None
        return self._statement_info(descriptor, statement.query, statement.params, context, planned, head)

    def _prepared_schema(self, cmd: Message, context) -> pa.Schema:
        return self._prepared_plan(self.statements.prepared(cmd.prepared_statement_handle), context)[1]

    def _ticket(self, cmd: Message, context) -> tuple[pa.Schema, Iterable[pa.RecordBatch]]:
        """A statement's rows: a query's, run now, or the result an update left when it was planned."""
        done = self.statements.take_result(cmd.statement_handle)
        if done is not None:  # a statement that changed tables when it was planned: its result
            return done.schema, done.to_batches()
        plan, schema, work, head = self.statements.start(cmd.statement_handle, user_of(context), self.store.version)
        context.add_callback(work.cancel)  # the client ended the call (or it finished): stop the model work
        batches = iter(head.batches) if head is not None else \
            self._stream(plan, None, lambda: schema, work, context, cmd.statement_handle)
        first = next(batches, None)  # the model work: its errors leave before any data, as a plain status
        return schema, [] if first is None else itertools.chain([first], batches)

    def _tables(self, cmd: Message) -> pa.Table:
        return metadata.tables(self.store, self.catalog.system_schemas(), _optional(cmd, "catalog"),
                               _optional(cmd, "db_schema_filter_pattern"), _optional(cmd, "table_name_filter_pattern"),
                               list(cmd.table_types), cmd.include_schema)

    def reads_data(self, descriptor, schema: pa.Schema | None) -> bool:
        """Ingest and parameter binds carry data; an update carries parameters only when its first message
        has a schema with columns (without, some clients wait for the answer before ending their stream)."""
        return sql.unpack(descriptor.cmd)[0] not in _UPDATES or bool(schema)

    def do_put(self, descriptor, schema: pa.Schema, batches: list[pa.RecordBatch], context) -> Iterable[bytes]:
        handler, cmd = self._route(descriptor.cmd, "DoPut")
        return handler(self, cmd, pa.Table.from_batches(batches, schema), context)

    def _ingested(self, cmd: Message, table: pa.Table, context) -> list[bytes]:
        return [sql.new("DoPutUpdateResult", record_count=self._ingest(cmd, table, context)).SerializeToString()]

    def _bind(self, cmd: Message, table: pa.Table, context) -> list[bytes]:
        """Parameter values for a prepared statement."""
        handle = cmd.prepared_statement_handle
        self.statements.bind(handle, _parameters(table))
        return [sql.new("DoPutPreparedStatementResult", prepared_statement_handle=handle).SerializeToString()]

    def _statement_update(self, cmd: Message, table: pa.Table, context) -> list[bytes]:
        return self._put_update(cmd.query, None, context)

    def _prepared_update(self, cmd: Message, table: pa.Table, context) -> list[bytes]:
        """A prepared update with the rows of parameters sent along, else those bound before."""
        statement = self.statements.prepared(cmd.prepared_statement_handle)
        return self._put_update(statement.query, _parameters(table) if table.num_columns else statement.params,
                                context)

    def _put_update(self, query: str, params: pa.Table | None, context) -> list[bytes]:
        """An update sent by DoPut, run once (or once per row of parameters) in one commit."""
        update, _ = self._plan(query, _first_row(params), context)
        if not isinstance(update, UpdatePlan):
            raise InvalidArgument("a query is not an update: ask for its rows with GetFlightInfo")
        _check_bound(update, params)
        rows = self._apply(query, update, params, context).column(0)[0].as_py()
        return [sql.new("DoPutUpdateResult", record_count=rows).SerializeToString()]

    def _ingest(self, cmd: Message, table: pa.Table, context) -> int:
        """Write an ingested stream: one atomic commit, and none for a stream cut off (_whole)."""
        self.access.require(context, "write", "ingest tables")
        if cmd.temporary:
            raise InvalidArgument("temporary tables are not supported")
        if not table.schema.names:
            raise InvalidArgument("the ingested stream carries no Arrow schema")
        catalog, schema = _optional(cmd, "catalog"), _optional(cmd, "schema")
        if catalog not in (None, "", CATALOG_NAME) or schema not in (None, "", SCHEMA_NAME):
            raise NotFound(f"schema {catalog or CATALOG_NAME}.{schema or SCHEMA_NAME} does not exist")
        options = cmd.table_definition_options
        _whole(context)
        rows = self.store.write(self.catalog.writable(cmd.table), table,
                                if_exists=_IF_EXISTS.get(options.if_exists, "fail"),
                                if_missing=_IF_MISSING.get(options.if_not_exist, "fail"))
        self.warm(table)
        log.info("ingest: %d rows into %s", rows, cmd.table)
        return rows

    def do_action(self, action, context) -> Iterable[bytes]:
        if action.type not in ACTIONS:
            raise Unimplemented(f"unsupported action {action.type!r}")
        return ACTIONS[action.type][1](self, action.body, context)

    def _prepare(self, body: bytes, context) -> list[bytes]:
        _, request = self._command(body, "CreatePreparedStatement")
        version = self.store.version  # before planning: a commit while it plans makes the plan not hold
        found: Future = Future()  # the result schema, as a head start's first batch leaves
        heads: list[HeadStart] = []

        def started(plan: PhysicalPlan) -> threading.Event | None:
            """Start the query; a query that asks the model: what its result schema waits for."""
            head = self._head_start(request.query, plan, found.result, version, context)
            if head is None:
                return None
            heads.append(head)
            return head.work.under_way if ai_steps(plan.steps) else None
        try:
            plan, schema = self._plan(request.query, None, context, started)
        except BaseException as err:
            found.set_exception(err)
            for head in heads:
                head.stop()
            raise
        found.set_result(schema)
        parameters = pa.schema([pa.field(f"parameter_{i + 1}", pa.null()) for i in range(plan.parameters)])
        kept, head = None, heads[0] if heads else None
        if isinstance(plan, PhysicalPlan) and not plan.parameters:
            kept = Planned(plan, schema, version, self.sessions.options(context)["dialect"])
        if isinstance(plan, UpdatePlan):
            schema = pa.schema([])  # an update: JDBC then runs it by DoPut(CommandPreparedStatementUpdate)
        result = sql.new("ActionCreatePreparedStatementResult",
                         prepared_statement_handle=self.statements.prepare(request.query, kept, head),
                         dataset_schema=schema_bytes(schema), parameter_schema=schema_bytes(parameters))
        return [sql.pack(result)]

    def _head_start(self, query: str, plan: PhysicalPlan, schema: Callable[[], pa.Schema], version: int,
                    context) -> HeadStart | None:
        """Run a query of no parameters just planned from now, its result schema still being found
        (statements.HeadStart), where the admission limit has room to spare (Admission.spare); None
        otherwise. Its work is under way (QueryWork.under_way) from its first pass, or from its first batch
        or its end where it needs none."""
        if plan.parameters or not self.admission.spare():
            return None
        handle, work = self.statements.begin(query, user_of(context))

        def first_schema() -> pa.Schema:
            work.under_way.set()
            return schema()
        batches = ReadAhead(self._stream(plan, None, first_schema, work, context, handle), self.heads)
        batches.first.add_done_callback(lambda _: work.under_way.set())
        return HeadStart(handle, work, batches, version)

    def _close_prepared(self, body: bytes, context) -> list[bytes]:
        _, request = self._command(body, "ClosePreparedStatement")
        self.statements.close(request.prepared_statement_handle)
        return []

    def _cancel_flight_info(self, body: bytes, context) -> list[bytes]:
        request = parse("CancelFlightInfoRequest", body)
        return [FLIGHT["CancelFlightInfoResult"](status=self._cancel(request.info)).SerializeToString()]

    def _cancel_query(self, body: bytes, context) -> list[bytes]:
        _, request = self._command(body, "CancelQuery")
        info = parse("FlightInfo", request.info)
        return [sql.pack(sql.new("ActionCancelQueryResult", result=self._cancel(info)))]

    def _cancel(self, info: Message) -> int:
        """Cancel the queries a FlightInfo's tickets name: the least final status among them."""
        statuses = []
        for endpoint in info.endpoint:
            name, ticket = sql.unpack(endpoint.ticket.ticket)
            if name != "TicketStatementQuery" or ticket is None:
                raise InvalidArgument("only a query's FlightInfo can be cancelled")
            statuses.append(self.statements.cancel(ticket.statement_handle))
        if not statuses:
            raise InvalidArgument("the FlightInfo names no query to cancel")
        return max(statuses, key=[CANCEL_STATUS_CANCELLED, CANCEL_STATUS_CANCELLING,
                                  CANCEL_STATUS_NOT_CANCELLABLE].index)

    def list_actions(self) -> list[tuple[str, str]]:
        return [(name, description) for name, (description, _) in ACTIONS.items()]


@dataclass(frozen=True)
class Route:
    """What each RPC does with one Flight SQL command (None: the RPC does not take it)."""

    info: Callable | None = None  # GetFlightInfo: (handler, command, descriptor, context) → FlightInfo
    schema: Callable | None = None  # GetSchema: (handler, command, context) → schema
    get: Callable | None = None  # DoGet: (handler, command, context) → (schema, batches)
    put: Callable | None = None  # DoPut: (handler, command, table, context) → result messages


def _listing(make: Callable[[FlightSQLHandler, Message], pa.Table]) -> Route:
    """A catalog command: its FlightInfo's ticket is the command itself, redeemed by DoGet for the listing."""
    return Route(info=lambda h, cmd, descriptor, context: h._info(descriptor, make(h, cmd).schema, descriptor.cmd),
                 schema=lambda h, cmd, context: make(h, cmd).schema,
                 get=lambda h, cmd, context: (lambda table: (table.schema, table.to_batches()))(make(h, cmd)))


COMMANDS: dict[str, Route] = {
    "CommandStatementQuery": Route(FlightSQLHandler._query_info, FlightSQLHandler._query_schema),
    "CommandStatementSubstraitPlan": Route(FlightSQLHandler._substrait_info, FlightSQLHandler._substrait_schema),
    "CommandPreparedStatementQuery": Route(FlightSQLHandler._prepared_info, FlightSQLHandler._prepared_schema,
                                           put=FlightSQLHandler._bind),
    "TicketStatementQuery": Route(get=FlightSQLHandler._ticket),
    "CommandStatementUpdate": Route(put=FlightSQLHandler._statement_update),
    "CommandPreparedStatementUpdate": Route(put=FlightSQLHandler._prepared_update),
    "CommandStatementIngest": Route(put=FlightSQLHandler._ingested),
    "CommandGetCatalogs": _listing(lambda h, cmd: metadata.catalogs()),
    "CommandGetDbSchemas": _listing(lambda h, cmd: metadata.db_schemas(
        _optional(cmd, "catalog"), _optional(cmd, "db_schema_filter_pattern"))),
    "CommandGetTables": _listing(FlightSQLHandler._tables),
    "CommandGetTableTypes": _listing(lambda h, cmd: metadata.table_types()),
    "CommandGetSqlInfo": _listing(lambda h, cmd: metadata.sql_info(list(cmd.info))),
    "CommandGetPrimaryKeys": _listing(lambda h, cmd: metadata.primary_keys()),
    "CommandGetImportedKeys": _listing(lambda h, cmd: metadata.foreign_keys()),
    "CommandGetExportedKeys": _listing(lambda h, cmd: metadata.foreign_keys()),
    "CommandGetCrossReference": _listing(lambda h, cmd: metadata.foreign_keys()),
    "CommandGetXdbcTypeInfo": _listing(lambda h, cmd: metadata.xdbc_type_info(_optional(cmd, "data_type"))),
}
_RPC_FIELDS = {"GetFlightInfo": "info", "GetSchema": "schema", "DoGet": "get", "DoPut": "put"}

ACTIONS: dict[str, tuple[str, Callable]] = {  # DoAction's types: (description, handler(handler, body, context))
    "CreatePreparedStatement": ("Prepare a SQL query; returns its handle and result schema", FlightSQLHandler._prepare),
    "ClosePreparedStatement": ("Release a prepared statement", FlightSQLHandler._close_prepared),
    "SetSessionOptions": ("Set session options: dialect (snowflake, bigquery, duckdb), catalog, schema",
                          lambda h, body, context: [h.sessions.set(context, parse("SetSessionOptionsRequest", body))]),
    "GetSessionOptions": ("The session's options", lambda h, body, context: [h.sessions.get(context)]),
    "CloseSession": ("Forget the session's options", lambda h, body, context: [h.sessions.close(context)]),
    "CancelFlightInfo": ("Cancel a query by its FlightInfo: stops its model work within a forward pass",
                         FlightSQLHandler._cancel_flight_info),
    "CancelQuery": ("Cancel a query by its FlightInfo (Flight SQL's older action)", FlightSQLHandler._cancel_query),
}


CUT_OFF_WAIT_S = 0.25  # gRPC ends a cut-off stream's messages a moment before it marks the call cancelled


def _whole(context) -> None:
    """Raise Cancelled unless the client ended its DoPut stream itself: a stream cut off (the client
    died, or the server is stopping) ends like a finished one, and only its cancellation tells them apart."""
    ended = threading.Event()
    if not context.add_callback(ended.set) or ended.wait(CUT_OFF_WAIT_S):
        raise Cancelled("the DoPut stream ended before the client finished it: nothing was written")


def _optional(message: Message, field: str) -> Any:
    """An optional field's value, None when unset."""
    return getattr(message, field) if message.HasField(field) else None


def _as_columns_of(rows: pa.Table, names: list[str], columns: tuple[str, ...], table: str) -> pa.Table:
    """INSERT's rows under the target table's column names: by the listed columns, else by position."""
    if columns:
        if sorted(c.lower() for c in columns) != sorted(n.lower() for n in names):
            raise InvalidArgument(f"INSERT INTO {table} must list each of its columns {names} once")
        renamed = rows.rename_columns([next(n for n in names if n.lower() == c.lower()) for c in columns])
        return renamed.select(names)
    if rows.num_columns != len(names):
        raise InvalidArgument(f"INSERT INTO {table} gives {rows.num_columns} columns; it has {len(names)}: {names}")
    return rows.rename_columns(names)


def _stacked(tables: list[pa.Table]) -> pa.Table:
    """The rows of several runs of one statement, by column position (each run names its columns anew)."""
    names = tables[0].column_names
    return pa.concat_tables([t.rename_columns(names) for t in tables], promote_options="permissive")


def _check_bound(plan: PhysicalPlan | UpdatePlan, params: pa.Table | None) -> None:
    """A statement with `?` placeholders runs only with values bound to them."""
    if plan.parameters and params is None:
        raise InvalidArgument(f"the statement has {plan.parameters} parameter(s) and no values were bound")


def _parameters(table: pa.Table) -> pa.Table | None:
    """Bound parameter rows (None: a bind of no rows, as none bound)."""
    return table if table.num_rows else None


def _rows(params: pa.Table) -> list[list[pa.Scalar]]:
    """Rows of parameter values, each value typed as the client sent it."""
    columns = params.columns
    return [[column[i] for column in columns] for i in range(params.num_rows)]


def _first_row(params: pa.Table | None) -> list[pa.Scalar] | None:
    return None if params is None else [column[0] for column in params.columns]
