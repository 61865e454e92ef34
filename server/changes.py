"""Statements that change something, run when their call comes, on the call's connection.

- A write runs once per row of its parameters, all in one transaction
  where the connection is in none (run_writes).
- SQL BEGIN, COMMIT and ROLLBACK on their own start and end a session's
  transaction; a transaction begun with BeginTransaction ends with
  EndTransaction.
- A text of several statements runs them in order, each planned as it comes;
  a transaction it begins on a connection of the call's own must end in it.
- A temporary table needs a connection that outlives the call (a session's or
  a transaction's).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import pyarrow as pa

from quail.engine.errors import InvalidArgument
from quail.engine.exec.database import Database
from quail.engine.exec.plan import PhysicalPlan, Write
from quail.engine.exec.writes import UPDATE_SCHEMA, changed_rows, run_writes
from quail.engine.runtime.query_work import QueryWork
from quail.planner.binder import python_values
from quail.planner.statements import Planned, Script

from quail.server.auth import Access
from quail.server.connections import Lease
from quail.server.query_service import QueryService
from quail.server.system_tables import WithSystemTables
from quail.server.warming import Warming

log = logging.getLogger("quail.server")
TEMPORARY = re.compile(r"\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP|TEMPORARY)\b", re.IGNORECASE)


@dataclass
class Changes:
    """Runs writes, transaction statements and texts of several statements.

    `plan` plans one statement of a
    call (text, one row of parameters, call context, catalog); `catalog` gives a call's catalog on a lease."""

    database: Database
    service: QueryService
    access: Access
    warming: Warming
    plan: Callable[[str, Sequence[Any] | None, Any, WithSystemTables], Planned]
    catalog: Callable[[Any, Lease], WithSystemTables]

    def run(self, query: str, plan: Write | Script, params: pa.Table | None, work: QueryWork, context,
            lease: Lease, catalog: WithSystemTables) -> pa.Table:
        """The statement's (or statements') result: RETURNING rows, the last statement's rows, or one row: the
        rows changed."""
        if isinstance(plan, Script):
            return self._script(plan, work, context, lease)
        if plan.transaction is not None:
            return self._transaction_statement(plan, lease, catalog, work)
        self.access.require(context, "write", "change the database")
        if lease.kept is None and TEMPORARY.match(plan.sql):
            raise InvalidArgument("a temporary table lives as long as its connection: create it in a session "
                                  "(SetSessionOptions, its cookie sent back) or a transaction, where it is used")
        writes = [plan]
        if params is not None and params.num_rows > 1:
            rows = parameter_rows(params)[1:]
            writes += [replace(plan, params=python_values(row)) for row in rows] if plan.prelude is None else \
                [self.plan(query, row, context, catalog) for row in rows]
        result = run_writes(writes, catalog, self.service.runtime, work, atomic=not lease.in_transaction)
        if not lease.in_transaction:
            self.database.changed()
        if plan.kind == "CREATE" and plan.target is not None and count(result):
            self.warming.table(lease.con, plan.target)
        log.info("%s: %d row(s) changed or returned", plan.kind, count(result))
        return result

    def _transaction_statement(self, plan: Write, lease: Lease, catalog: WithSystemTables,
                               work: QueryWork) -> pa.Table:
        """SQL BEGIN, COMMIT or ROLLBACK on its own: a session's transaction, begun or ended."""
        if lease.transaction is not None:
            raise InvalidArgument("the transaction was begun with BeginTransaction: end it with EndTransaction "
                                  "(ADBC: commit() or rollback())")
        if lease.kept is None:
            raise InvalidArgument(
                f"{plan.transaction.upper()} outside a session would end with its call: use the driver's "
                "transactions (ADBC: autocommit off; Flight SQL: BeginTransaction), open a session "
                "(SetSessionOptions, its cookie sent back), or send BEGIN, the statements and COMMIT in one text")
        if (plan.transaction == "begin") == lease.in_transaction:
            raise InvalidArgument("a transaction is open already: COMMIT or ROLLBACK it first"
                                  if lease.in_transaction else f"no transaction is open to {plan.transaction.upper()}")
        result = run_writes([plan], catalog, self.service.runtime, work, atomic=False)
        lease.kept.open = plan.transaction == "begin"
        if plan.transaction == "commit":
            self.database.changed()
        return result

    def _script(self, script: Script, work: QueryWork, context, lease: Lease) -> pa.Table:
        """Several statements in order on one connection, each planned as it comes; the last one's result."""
        result, open_ = changed_rows(0), lease.in_transaction
        try:
            for text in script.texts:
                catalog = self.catalog(context, lease)
                plan = self.plan(text, None, context, catalog)
                if isinstance(plan, PhysicalPlan):
                    result = self.service.execute(plan, catalog, work)
                    continue
                if isinstance(plan, Script) or plan.parameters:
                    raise InvalidArgument("each statement of a text of several must stand alone, without "
                                          "parameters")
                if plan.transaction is None:
                    self.access.require(context, "write", "change the database")
                elif lease.transaction is not None:
                    raise InvalidArgument("a transaction begun with BeginTransaction ends with EndTransaction")
                result = run_writes([plan], catalog, self.service.runtime, work, atomic=False)
                open_ = open_ if plan.transaction is None else plan.transaction == "begin"
        finally:
            if lease.kept is not None:
                lease.kept.open = open_
            elif open_:
                lease.con.rollback()
            if not open_:
                self.database.changed()
        if open_ and lease.kept is None:
            raise InvalidArgument("the statements left their transaction open, so it was rolled back: end it with "
                                  "COMMIT in the same text, or use a session or the driver's transactions")
        return result


def count(result: pa.Table) -> int:
    """The rows a statement changed (its result's rows_affected), or returned (RETURNING, a query)."""
    if result.schema == UPDATE_SCHEMA:
        return result.column(0)[0].as_py()
    return result.num_rows


def parameter_rows(params: pa.Table) -> list[list[pa.Scalar]]:
    """Rows of parameter values, each value typed as the client sent it."""
    columns = params.columns
    return [[column[i] for column in columns] for i in range(params.num_rows)]
