"""Flight SQL's actions (DoAction): prepared statements, transactions, cancellation, session options.

- `Actions` is a part of the Flight SQL handler (flight_sql.py) kept in a file of its own: the handler is an
  `Actions`, and these methods use its connections, statements, planning and streaming.
- `ACTIONS` names each action type, what ListActions says of it, and the method that answers it.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable

import pyarrow as pa
from google.protobuf.message import Message

from quail.engine.errors import InvalidArgument, Unimplemented
from quail.engine.exec.database import Database
from quail.engine.exec.plan import PhysicalPlan, ai_steps

from quail.server import sql_messages as sql
from quail.server.admission import Admission
from quail.server.auth import Access, user_of
from quail.server.connections import Connections
from quail.server.flight_messages import (CANCEL_STATUS_CANCELLED, CANCEL_STATUS_CANCELLING,
                                          CANCEL_STATUS_NOT_CANCELLABLE, FLIGHT, parse)
from quail.server.ipc import schema_bytes
from quail.server.read_ahead import ReadAhead
from quail.server.session_options import Sessions
from quail.server.statements import HeadStart, Kept, Statements


class Actions:
    """DoAction and ListActions of the Flight SQL handler (see the module)."""

    database: Database
    connections: Connections
    statements: Statements
    sessions: Sessions
    admission: Admission
    access: Access
    heads: ThreadPoolExecutor

    def do_action(self, action, context) -> Iterable[bytes]:
        if action.type not in ACTIONS:
            raise Unimplemented(f"unsupported action {action.type!r}")
        return ACTIONS[action.type][1](self, action.body, context)

    def _prepare(self, body: bytes, context) -> list[bytes]:
        _, request = self._command(body, "CreatePreparedStatement")
        transaction = sql.transaction(request)
        version = self.database.version  # before planning: a commit while it plans makes the plan not hold
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
            with self._lease(context, transaction) as lease:
                plan, schema = self._plan(request.query, None, context, self._catalog(context, lease),
                                          started if lease.kept is None else None)
                alone = lease.kept is None
        except BaseException as err:
            found.set_exception(err)
            for head in heads:
                head.stop()
            raise
        found.set_result(schema)
        parameters = pa.schema([pa.field(f"parameter_{i + 1}", pa.null()) for i in range(plan.parameters)])
        kept, head = None, heads[0] if heads else None
        if isinstance(plan, PhysicalPlan) and not plan.parameters and alone:
            kept = Kept(plan, schema, version, self._dialect(context))
        if not isinstance(plan, PhysicalPlan) and not plan.returns_rows:
            schema = pa.schema([])  # an update: JDBC then runs it by DoPut(CommandPreparedStatementUpdate)
        result = sql.new("ActionCreatePreparedStatementResult",
                         prepared_statement_handle=self.statements.prepare(request.query, user_of(context), kept, head,
                                                                      transaction),
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
        batches = ReadAhead(self._stream(lambda: self._query_batches(plan, work, context, None), first_schema, work,
                                         context, handle), self.heads)
        batches.first.add_done_callback(lambda _: work.under_way.set())
        return HeadStart(handle, work, batches, version)

    def _close_prepared(self, body: bytes, context) -> list[bytes]:
        _, request = self._command(body, "ClosePreparedStatement")
        self.statements.close(request.prepared_statement_handle, user_of(context))
        return []

    def _begin_transaction(self, body: bytes, context) -> list[bytes]:
        self._command(body, "BeginTransaction")
        transaction = self.connections.begin(user_of(context))
        return [sql.pack(sql.new("ActionBeginTransactionResult", transaction_id=transaction))]

    def _end_transaction(self, body: bytes, context) -> list[bytes]:
        _, request = self._command(body, "EndTransaction")
        if request.action not in (sql.END_TRANSACTION_COMMIT, sql.END_TRANSACTION_ROLLBACK):
            raise InvalidArgument("EndTransaction needs its action: commit or rollback")
        self.connections.end(request.transaction_id, user_of(context), request.action == sql.END_TRANSACTION_COMMIT)
        return []

    def _cancel_flight_info(self, body: bytes, context) -> list[bytes]:
        request = parse("CancelFlightInfoRequest", body)
        return [FLIGHT["CancelFlightInfoResult"](status=self._cancel(request.info, context)).SerializeToString()]

    def _cancel_query(self, body: bytes, context) -> list[bytes]:
        _, request = self._command(body, "CancelQuery")
        info = parse("FlightInfo", request.info)
        return [sql.pack(sql.new("ActionCancelQueryResult", result=self._cancel(info, context)))]

    def _cancel(self, info: Message, context) -> int:
        """Cancel the queries a FlightInfo's tickets name, where they are the caller's (an admin's: anyone's):
        the least final status among them."""
        user = None if self.access.allows(context, "admin") and self.access.users is not None else user_of(context)
        statuses = []
        for endpoint in info.endpoint:
            name, ticket = sql.unpack(endpoint.ticket.ticket)
            if name != "TicketStatementQuery" or ticket is None:
                raise InvalidArgument("only a query's FlightInfo can be cancelled")
            statuses.append(self.statements.cancel(ticket.statement_handle, user))
        if not statuses:
            raise InvalidArgument("the FlightInfo names no query to cancel")
        return max(statuses, key=[CANCEL_STATUS_CANCELLED, CANCEL_STATUS_CANCELLING,
                                  CANCEL_STATUS_NOT_CANCELLABLE].index)

    def list_actions(self) -> list[tuple[str, str]]:
        return [(name, description) for name, (description, _) in ACTIONS.items()]



ACTIONS: dict[str, tuple[str, Callable]] = {  # DoAction's types: (description, handler(handler, body, context))
    "CreatePreparedStatement": ("Prepare a SQL query; returns its handle and result schema", Actions._prepare),
    "ClosePreparedStatement": ("Release a prepared statement", Actions._close_prepared),
    "BeginTransaction": ("Begin a transaction; returns its id, which later commands carry",
                         Actions._begin_transaction),
    "EndTransaction": ("Commit or roll back a transaction", Actions._end_transaction),
    "SetSessionOptions": ("Set session options: dialect (snowflake, bigquery, duckdb), catalog, schema",
                          lambda h, body, context: [h.sessions.set(context, parse("SetSessionOptionsRequest", body))]),
    "GetSessionOptions": ("The session's options", lambda h, body, context: [h.sessions.get(context)]),
    "CloseSession": ("Forget the session: its options, and its connection (rolling back what it left uncommitted)",
                     lambda h, body, context: [h.connections.end_session(h.sessions.known(context)),
                                               h.sessions.close(context)][1:]),
    "CancelFlightInfo": ("Cancel a query by its FlightInfo: stops its model work within a forward pass",
                         Actions._cancel_flight_info),
    "CancelQuery": ("Cancel a query by its FlightInfo (Flight SQL's older action)", Actions._cancel_query),
}
