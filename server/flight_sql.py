"""Flight SQL semantics over the Flight service: commands, tickets, prepared statements, transactions, ingest.

Each call's statements run on a connection to the database (connections.py):
a new one, its session's, or its transaction's. A query is planned at GetFlightInfo and runs
when its ticket is redeemed; a statement that changes something runs at
GetFlightInfo (or DoPut), so it has taken effect when the client's execute()
returns. The actions (prepare, transactions, cancel) are flight_actions.py's.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import duckdb
import pyarrow as pa
from google.protobuf.message import Message

from quail.engine.errors import Cancelled, InvalidArgument, NotFound, QuailError, Unimplemented
from quail.engine.exec.database import Database
from quail.engine.exec.plan import PhysicalPlan, Write
from quail.engine.runtime.query_work import QueryWork
from quail.planner.binder import CATALOG_NAME, SCHEMA_NAME
from quail.planner.dialects import DIALECTS
from quail.planner.statements import Planned, Script
from quail.planner.substrait.consumer import QUERY_TEXT

from quail.server import metadata
from quail.server import sql_messages as sql
from quail.server.admission import Admission, Limits
from quail.server.auth import Access, user_of
from quail.server.config import TRANSACTION_IDLE_S
from quail.server.connections import Connections, Lease
from quail.server.flight_actions import Actions
from quail.server.flight_messages import FLIGHT
from quail.server.ingest import ingest
from quail.server.ipc import bounded_batches, plain_schema, schema_bytes
from quail.server.metrics import Metrics
from quail.server.changes import Changes, count
from quail.server.query_service import QueryService
from quail.server.session_options import LAST_QUERY, Sessions
from quail.server.statements import Kept, PreparedStatement, Statements
from quail.server.status import status_of
from quail.server.system_tables import QUERIES, QUERIES_SCHEMA, WithSystemTables, queries_table
from quail.server.warming import Warming

log = logging.getLogger("quail.server")
BATCH_ROWS = 65536

_IF_EXISTS = {sql.TABLE_EXISTS_UNSPECIFIED: "fail", sql.TABLE_EXISTS_FAIL: "fail",
              sql.TABLE_EXISTS_APPEND: "append", sql.TABLE_EXISTS_REPLACE: "replace"}
_IF_MISSING = {sql.TABLE_NOT_EXIST_UNSPECIFIED: "fail", sql.TABLE_NOT_EXIST_CREATE: "create",
               sql.TABLE_NOT_EXIST_FAIL: "fail"}
_UPDATES = ("CommandStatementUpdate", "CommandPreparedStatementUpdate")


class FlightSQLHandler(Actions):
    """Answers Flight SQL commands against one database and one model runtime."""

    def __init__(self, database: Database, service: QueryService, dialect: str, limits: Limits = Limits(),
                 metrics: Metrics | None = None, access: Access = Access(),
                 transaction_idle_s: float = TRANSACTION_IDLE_S) -> None:
        self.database = database
        self.connections = Connections(database, transaction_idle_s)
        self.service = service
        self.admission = Admission(limits.max_active)
        self.limits = limits
        self.metrics = metrics or Metrics(service.runtime)
        self.sessions = Sessions({"dialect": dialect, "catalog": CATALOG_NAME, "schema": SCHEMA_NAME},
                                 {"dialect": tuple(DIALECTS), "catalog": (CATALOG_NAME,), "schema": (SCHEMA_NAME,)})
        self.statements = Statements(limits.work)
        self.heads = ThreadPoolExecutor(limits.max_active, "quail-head")  # head starts' batches, made ahead
        self.warming = Warming(service.runtime, self.metrics)
        self.access = access
        self.changes = Changes(database, service, access, self.warming,
                               lambda query, params, context, catalog: self._plan(query, params, context, catalog)[0],
                               self._catalog)

    def cancel_all(self) -> None:
        """Cancel every running query and the warming not yet begun (the server is stopping)."""
        self.warming.stop()
        for running in self.statements.running().values():
            running.work.cancel()

    def wait_ended(self, deadline: float) -> None:
        """Until no statement runs (each cancelled one stops within a forward pass or a DuckDB interrupt), or
        `deadline` (time.monotonic()) passes."""
        while self.statements.running() and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        """Roll back the transactions still open (the server has stopped)."""
        self.connections.close_all()

    def _catalog(self, context, lease: Lease) -> WithSystemTables:
        """What a call's statements read on its connection: the database's tables, and the system tables as the
        caller sees them (an admin every user's query text, others only their own)."""
        viewer, everyone = user_of(context), self.access.allows(context, "admin")
        return WithSystemTables(lease.catalog(), {QUERIES: (QUERIES_SCHEMA, lambda: queries_table(
            self.statements.running(), viewer, everyone, self.service.runtime.scheduler.place))})

    def _lease(self, context, transaction: bytes | None):
        """The connection a call's statements run on: its transaction's, its session's, or its own
        (Connections.lease)."""
        return self.connections.lease(transaction, self.sessions.known(context), user_of(context))

    def _dialect(self, context) -> str:
        return self.sessions.options(context)["dialect"]

    @staticmethod
    def _command(data: bytes, where: str) -> tuple[str, Message]:
        name, message = sql.unpack(data)
        if message is None:
            raise Unimplemented(f"{where}: unsupported command {name or '(not a Flight SQL command)'}")
        return name, message

    def _plan(self, query: str, params: list[pa.Scalar] | None, context, catalog: WithSystemTables,
              started: Callable[[PhysicalPlan], threading.Event | None] | None = None, since: float | None = None
              ) -> tuple[Planned, pa.Schema | None]:
        """A statement's plan and result schema (None for a text of several statements). `params`: one row of
        bound parameter values; `started`: given a query's plan before its result schema is found, and may
        give back what finding it waits for (QueryService.plan); `since`: when the statement's time limit
        started (None: now)."""
        self.limits.check_text(query)
        planning = self.limits.work(since)  # planning counts toward the statement's time limit, and stops with its call
        context.add_callback(planning.cancel)
        plan, schema = self.service.plan(query, catalog, self._dialect(context), params, planning, started)
        return plan, None if schema is None else plain_schema(schema)

    def _prepared_plan(self, statement: PreparedStatement, context, catalog: WithSystemTables,
                       since: float | None = None) -> tuple[Planned, pa.Schema | None]:
        """A prepared statement's plan and schema for its bound parameters: the one made when it was
        prepared, while that holds (Kept.holds)."""
        kept = self._holding(statement, context)
        if kept is not None:
            return kept.plan, kept.schema
        return self._plan(statement.query, _first_row(statement.params), context, catalog, since=since)

    def _holding(self, statement: PreparedStatement, context) -> Kept | None:
        """The plan kept when the statement was prepared, while it holds for the call and no parameters are
        bound (None: plan afresh)."""
        kept = statement.planned
        if kept is not None and statement.params is None and kept.holds(self.database.version,
                                                                         self._dialect(context)):
            return kept
        return None

    def _stream(self, batches: Callable[[], Iterable[pa.RecordBatch]], schema: Callable[[], pa.Schema] | None,
                work: QueryWork, context, handle: bytes) -> Iterator[pa.RecordBatch]:
        """A statement's batches, as `batches` makes them, admitted first; then its report (session option,
        metrics, log line). `schema` gives the result schema the batches are cast to (a head start's is found
        while it runs; None: the batches' own); `handle`: its running entry."""
        start, rows = time.perf_counter(), 0
        try:
            with self.admission.admit(), self.metrics.running.track_inprogress():
                for batch in batches():
                    work.check()  # the client ended the call: stop reading
                    rows += batch.num_rows
                    yield batch if schema is None or batch.schema.equals(target := schema()) else batch.cast(target)
        except QuailError as err:
            if isinstance(err, Cancelled):
                log.info("query cancelled after %.3fs, %d forward passes", time.perf_counter() - start,
                         work.stats.forward_passes)
            self.metrics.query_failed(status_of(err))
            raise
        finally:
            self.statements.finish(handle, work)
        report = self.service.report(work, time.perf_counter() - start)
        self.sessions.record(context, LAST_QUERY, lambda: json.dumps(report))
        self.metrics.query_done(report)
        log.info("query %s done for %s: %d rows in %.3fs, %d requests, %d logical / %d fresh tokens",
                 handle[:8].hex(), user_of(context), rows, report["wall_s"], report["requests"],
                 report["logical_tokens"], report["fresh_tokens"])

    def _query_batches(self, plan: PhysicalPlan, work: QueryWork, context,
                       transaction: bytes | None) -> Iterator[pa.RecordBatch]:
        """A query's rows on its connection: streamed as produced, or, on a session's or a transaction's (which
        runs one statement at a time), made whole first, so the client may run its next statement while it reads."""
        with self._lease(context, transaction) as lease:
            catalog = self._catalog(context, lease)
            if lease.kept is None:
                yield from self.service.stream(plan, catalog, work, BATCH_ROWS)
                return
            rows = self.service.execute(plan, catalog, work)
        yield from rows.to_batches(max_chunksize=BATCH_ROWS)

    def _run_now(self, query: str, plan: Write | Script, params: pa.Table | None, context, lease: Lease,
                 catalog: WithSystemTables, since: float | None = None) -> pa.Table:
        """Run a statement that changes something (or a text of several statements) on the call's connection; its
        result (RETURNING rows, the last statement's rows, or one row: the rows changed). `since`: when its time
        limit started (its planning's start; None: now)."""
        handle, work = self.statements.begin(query, user_of(context), since)
        context.add_callback(work.cancel)
        made: list[pa.Table] = []

        def run() -> Iterator[pa.RecordBatch]:
            made.append(self.changes.run(query, plan, params, work, context, lease, catalog))
            return iter(made[0].to_batches())
        for _ in self._stream(run, None, work, context, handle):
            pass
        return made[0]

    @staticmethod
    def _info(descriptor, schema: pa.Schema, ticket: bytes) -> Message:
        endpoint = FLIGHT["FlightEndpoint"](ticket=FLIGHT["Ticket"](ticket=ticket))
        return FLIGHT["FlightInfo"](schema=schema_bytes(schema), flight_descriptor=descriptor,
                                    endpoint=[endpoint], total_records=-1, total_bytes=-1)

    @staticmethod
    def _ticket_of(handle: bytes) -> bytes:
        return sql.pack(sql.new("TicketStatementQuery", statement_handle=handle))

    def _statement_info(self, descriptor, query: str, params: pa.Table | None, context, transaction: bytes | None,
                        prepared: PreparedStatement | None = None, head: bytes | None = None) -> Message:
        """FlightInfo of a statement. A query is planned here (a prepared one's kept plan used while it holds) and
        runs when its ticket is redeemed (`head`: the handle of its head start, its ticket's); a statement that
        changes something runs here, so it has taken effect when the client's execute() returns, whether or
        not the client fetches its result (the ticket then reads that result). The statement's time limit
        starts here: planning, running and reading its rows count toward it."""
        since = time.monotonic()
        with self._lease(context, transaction) as lease:
            catalog = self._catalog(context, lease)
            plan, schema = self._prepared_plan(prepared, context, catalog, since) if prepared is not None else \
                self._plan(query, _first_row(params), context, catalog, since=since)
            if head is not None and (prepared.planned is None or plan is not prepared.planned.plan):
                self.statements.stop_head(head)  # the plan it ran no longer holds
                head = None
            _check_bound(plan, params)
            if isinstance(plan, PhysicalPlan):
                if params is not None and params.num_rows != 1:
                    raise InvalidArgument(f"bind exactly one row of parameters to a query, not {params.num_rows}")
                handle = self.statements.add_pending(plan, schema, query, user_of(context), head, lease.transaction, since)
                return self._info(descriptor, schema, self._ticket_of(handle))
            result = self._run_now(query, plan, params, context, lease, catalog, since)
        handle = self.statements.add_result(result, user_of(context))
        return self._info(descriptor, plain_schema(result.schema), self._ticket_of(handle))

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
        return self._statement_info(descriptor, cmd.query, None, context, sql.transaction(cmd))

    def _schema_of(self, query: str, context, transaction: bytes | None) -> pa.Schema:
        """A statement's result schema, nothing run (a text of several: the empty schema, its result unknown)."""
        with self._lease(context, transaction) as lease:
            schema = self._plan(query, None, context, self._catalog(context, lease))[1]
        return schema if schema is not None else pa.schema([])

    def _query_schema(self, cmd: Message, context) -> pa.Schema:
        return self._schema_of(cmd.query, context, sql.transaction(cmd))

    def _substrait(self, cmd: Message, context) -> tuple[PhysicalPlan, pa.Schema]:
        """A CommandStatementSubstraitPlan's plan and result schema."""
        with self._lease(context, sql.transaction(cmd)) as lease:
            plan, schema = self.service.plan_substrait(cmd.plan.plan, self._catalog(context, lease))
        return plan, plain_schema(schema)

    def _substrait_info(self, cmd: Message, descriptor, context) -> Message:
        plan, schema = self._substrait(cmd, context)
        handle = self.statements.add_pending(plan, schema, QUERY_TEXT, user_of(context))
        return self._info(descriptor, schema, self._ticket_of(handle))

    def _substrait_schema(self, cmd: Message, context) -> pa.Schema:
        return self._substrait(cmd, context)[1]

    def _prepared_info(self, cmd: Message, descriptor, context) -> Message:
        """A prepared statement's FlightInfo; its first names its head start, where the plan it ran still
        holds (else the head start stops)."""
        statement = self.statements.prepared(cmd.prepared_statement_handle, user_of(context))
        head = self.statements.take_head(statement)
        kept = self._holding(statement, context)
        if kept is not None:  # nothing to plan: no connection leased (a kept plan has neither session nor transaction)
            handle = self.statements.add_pending(kept.plan, kept.schema, statement.query, user_of(context), head,
                                                 since=time.monotonic())
            return self._info(descriptor, kept.schema, self._ticket_of(handle))
        return self._statement_info(descriptor, statement.query, statement.params, context, statement.transaction,
                                    statement, head)

    def _prepared_schema(self, cmd: Message, context) -> pa.Schema:
        statement = self.statements.prepared(cmd.prepared_statement_handle, user_of(context))
        with self._lease(context, statement.transaction) as lease:
            schema = self._prepared_plan(statement, context, self._catalog(context, lease))[1]
        return schema if schema is not None else pa.schema([])

    def _ticket(self, cmd: Message, context) -> tuple[pa.Schema, Iterable[pa.RecordBatch]]:
        """A statement's rows: a query's, run now, or the result a statement that changed something left."""
        done = self.statements.take_result(cmd.statement_handle, user_of(context))
        if done is not None:  # a statement that ran when it was planned: its result
            return plain_schema(done.schema), done.to_batches()
        plan, schema, work, head, transaction = self.statements.start(cmd.statement_handle, user_of(context),
                                                                      self.database.version)
        context.add_callback(work.cancel)  # the client ended the call (or it finished): stop the model work
        batches = iter(head.batches) if head is not None else self._stream(
            lambda: self._query_batches(plan, work, context, transaction), lambda: schema, work, context,
            cmd.statement_handle)
        first = next(batches, None)  # the model work: its errors leave before any data, as a plain status
        return schema, [] if first is None else itertools.chain([first], batches)

    def _listed(self, make: Callable[[duckdb.DuckDBPyConnection], pa.Table], context) -> pa.Table:
        """A catalog listing made on a connection of the caller's (its transaction's tables included)."""
        with self._lease(context, None) as lease:
            return make(lease.con)

    def _tables(self, cmd: Message, context) -> pa.Table:
        return self._listed(lambda con: metadata.tables(
            con, {QUERIES: QUERIES_SCHEMA}, sql.optional(cmd, "catalog"), sql.optional(cmd, "db_schema_filter_pattern"),
            sql.optional(cmd, "table_name_filter_pattern"), list(cmd.table_types), cmd.include_schema), context)

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
        self.statements.bind(handle, _parameters(table), user_of(context))
        return [sql.new("DoPutPreparedStatementResult", prepared_statement_handle=handle).SerializeToString()]

    def _statement_update(self, cmd: Message, table: pa.Table, context) -> list[bytes]:
        return self._put_update(cmd.query, None, context, sql.transaction(cmd))

    def _prepared_update(self, cmd: Message, table: pa.Table, context) -> list[bytes]:
        """A prepared update with the rows of parameters sent along, else those bound before."""
        statement = self.statements.prepared(cmd.prepared_statement_handle, user_of(context))
        return self._put_update(statement.query, _parameters(table) if table.num_columns else statement.params,
                                context, statement.transaction)

    def _put_update(self, query: str, params: pa.Table | None, context, transaction: bytes | None) -> list[bytes]:
        """An update sent by DoPut, run once (or once per row of parameters, in one transaction)."""
        since = time.monotonic()
        with self._lease(context, transaction) as lease:
            catalog = self._catalog(context, lease)
            update, _ = self._plan(query, _first_row(params), context, catalog, since=since)
            if isinstance(update, PhysicalPlan):
                raise InvalidArgument("a query is not an update: ask for its rows with GetFlightInfo")
            _check_bound(update, params)
            result = self._run_now(query, update, params, context, lease, catalog, since)
        return [sql.new("DoPutUpdateResult", record_count=count(result)).SerializeToString()]

    def _ingest(self, cmd: Message, table: pa.Table, context) -> int:
        """Write an ingested stream in one statement, and nothing for a stream cut off (_whole) or a call ended
        before the write commits (Lease.committed_if)."""
        self.access.require(context, "write", "ingest tables")
        if not table.schema.names:
            raise InvalidArgument("the ingested stream carries no Arrow schema")
        if sql.optional(cmd, "catalog") not in (None, "", CATALOG_NAME):
            raise NotFound(f"catalog {cmd.catalog} does not exist")
        if cmd.table.lower() == QUERIES:
            raise InvalidArgument(f"{cmd.table} is a system table: it cannot be written")
        options = cmd.table_definition_options
        _whole(context)
        with self._lease(context, sql.transaction(cmd)) as lease:
            if cmd.temporary and lease.kept is None:
                raise InvalidArgument("a temporary table lives as long as its connection: ingest it in a session "
                                      "or a transaction, where it is used")
            with lease.committed_if(context.is_active):
                rows = ingest(lease.con, table, cmd.table, sql.optional(cmd, "schema") or None,
                              _IF_EXISTS.get(options.if_exists, "fail"),
                              _IF_MISSING.get(options.if_not_exist, "fail"), cmd.temporary)
            if not lease.in_transaction:
                self.database.changed()
        self.warming.warm(table)
        log.info("ingest: %d rows into %s", rows, cmd.table)
        return rows


@dataclass(frozen=True)
class Route:
    """What each RPC does with one Flight SQL command (None: the RPC does not take it)."""

    info: Callable | None = None  # GetFlightInfo: (handler, command, descriptor, context) → FlightInfo
    schema: Callable | None = None  # GetSchema: (handler, command, context) → schema
    get: Callable | None = None  # DoGet: (handler, command, context) → (schema, batches)
    put: Callable | None = None  # DoPut: (handler, command, table, context) → result messages


def _listing(make: Callable[[FlightSQLHandler, Message, Any], pa.Table]) -> Route:
    """A catalog command: its FlightInfo's ticket is the command itself, redeemed by DoGet for the listing
    (`make`: handler, command, call context → the listing)."""
    return Route(info=lambda h, cmd, descriptor, context: h._info(descriptor, make(h, cmd, context).schema,
                                                                 descriptor.cmd),
                 schema=lambda h, cmd, context: make(h, cmd, context).schema,
                 get=lambda h, cmd, context: (lambda table: (table.schema, bounded_batches(table)))(make(h, cmd, context)))


def _keys(kind: str) -> Route:
    """GetPrimaryKeys, GetImportedKeys, GetExportedKeys or GetCrossReference, from the database's constraints."""
    return _listing(lambda h, cmd, context: h._listed(lambda con: metadata.keys(con, kind, cmd), context))


COMMANDS: dict[str, Route] = {
    "CommandStatementQuery": Route(FlightSQLHandler._query_info, FlightSQLHandler._query_schema),
    "CommandStatementSubstraitPlan": Route(FlightSQLHandler._substrait_info, FlightSQLHandler._substrait_schema),
    "CommandPreparedStatementQuery": Route(FlightSQLHandler._prepared_info, FlightSQLHandler._prepared_schema,
                                           put=FlightSQLHandler._bind),
    "TicketStatementQuery": Route(get=FlightSQLHandler._ticket),
    "CommandStatementUpdate": Route(put=FlightSQLHandler._statement_update),
    "CommandPreparedStatementUpdate": Route(put=FlightSQLHandler._prepared_update),
    "CommandStatementIngest": Route(put=FlightSQLHandler._ingested),
    "CommandGetCatalogs": _listing(lambda h, cmd, context: metadata.catalogs()),
    "CommandGetDbSchemas": _listing(lambda h, cmd, context: h._listed(lambda con: metadata.db_schemas(
        con, sql.optional(cmd, "catalog"), sql.optional(cmd, "db_schema_filter_pattern")), context)),
    "CommandGetTables": _listing(FlightSQLHandler._tables),
    "CommandGetTableTypes": _listing(lambda h, cmd, context: metadata.table_types()),
    "CommandGetSqlInfo": _listing(lambda h, cmd, context: metadata.sql_info(tuple(cmd.info))),
    "CommandGetPrimaryKeys": _keys("primary"),
    "CommandGetImportedKeys": _keys("imported"),
    "CommandGetExportedKeys": _keys("exported"),
    "CommandGetCrossReference": _keys("cross"),
    "CommandGetXdbcTypeInfo": _listing(lambda h, cmd, context: metadata.xdbc_type_info(sql.optional(cmd, "data_type"))),
}
_RPC_FIELDS = {"GetFlightInfo": "info", "GetSchema": "schema", "DoGet": "get", "DoPut": "put"}



CUT_OFF_WAIT_S = 0.25  # gRPC ends a cut-off stream's messages a moment before it marks the call cancelled


def _whole(context) -> None:
    """Raise Cancelled unless the client ended its DoPut stream itself: a stream cut off (the client
    died, or the server is stopping) ends like a finished one, and only its cancellation tells them apart."""
    ended = threading.Event()
    if not context.add_callback(ended.set) or ended.wait(CUT_OFF_WAIT_S):
        raise Cancelled("the DoPut stream ended before the client finished it: nothing was written")


def _check_bound(plan: Planned, params: pa.Table | None) -> None:
    """A statement with `?` placeholders runs only with values bound to them; several statements take none."""
    if isinstance(plan, Script):
        if params is not None:
            raise InvalidArgument("parameters bind one statement, not a text of several")
        return
    if plan.parameters and params is None:
        raise InvalidArgument(f"the statement has {plan.parameters} parameter(s) and no values were bound")


def _parameters(table: pa.Table) -> pa.Table | None:
    """Bound parameter rows (None: a bind of no rows, as none bound)."""
    return table if table.num_rows else None


def _first_row(params: pa.Table | None) -> list[pa.Scalar] | None:
    return None if params is None else [column[0] for column in params.columns]
