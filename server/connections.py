"""Where each call's statements run: a database connection of its own, a session's, or a transaction's.

- A call with neither a transaction nor a session leases a new connection
  (autocommit: each statement commits as it ends) and closes it after.
- A Flight session (its cookie) keeps one connection across its calls, as a
  database client keeps its connection: temporary tables, prepared SQL,
  variables and a transaction begun with SQL `BEGIN` live there until
  `COMMIT` / `ROLLBACK`, or until the session closes.
- Flight SQL's BeginTransaction opens a transaction on a connection of its
  own, named by a random 16-byte id that later calls carry, until
  EndTransaction.
- A kept connection runs one statement at a time (its lock), only for the
  user who opened it. One idle for `idle_s` is closed, rolling back what it
  had not committed (its client is gone), as every one is when the server
  stops.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import duckdb

from quail.engine.errors import Cancelled, NotFound
from quail.engine.exec.database import Database, DatabaseCatalog
from quail.engine.exec.relational import duckdb_errors
from quail.server.config import TRANSACTION_IDLE_S


@dataclass
class Kept:
    """A connection kept across calls: a Flight transaction's (`transaction`: its id) or a session's.

    `open`: a transaction is open on it (always, for a Flight transaction; after SQL BEGIN, for a session)."""

    con: duckdb.DuckDBPyConnection
    user: str
    transaction: bytes | None = None
    open: bool = False
    used: float = field(default_factory=time.monotonic)
    lock: threading.RLock = field(default_factory=threading.RLock)  # one statement at a time


@dataclass
class Lease:
    """A call's connection, and what keeps it (None: a connection of the call's own, autocommit)."""

    database: Database
    con: duckdb.DuckDBPyConnection
    kept: Kept | None

    def catalog(self) -> DatabaseCatalog:
        """The tables the connection sees now (a fresh view after each statement that may change them)."""
        return DatabaseCatalog(self.database, self.con, committed=not self.in_transaction)

    @property
    def in_transaction(self) -> bool:
        """Whether its statements run inside an open transaction (else each commits as it ends)."""
        return self.kept is not None and self.kept.open

    @property
    def transaction(self) -> bytes | None:
        """The id of the Flight transaction it belongs to, if any."""
        return self.kept.transaction if self.kept is not None else None

    @contextmanager
    def committed_if(self, alive: Callable[[], bool]) -> Iterator[None]:
        """The statements inside in one transaction of their own, committed only if `alive()` still holds
        after them.

        - `alive`: whether the call that asked for them is still there to be told (a call ended meanwhile,
          by its client or by a server stopping past its grace, would report a failure for a write that
          was made): else they are rolled back, and the call ends CANCELLED.
        - Inside an open transaction: run as they are (its commit comes later, by its own call).
        """
        if self.in_transaction:
            yield
            return
        self.con.execute("BEGIN")
        try:
            yield
            if not alive():
                raise Cancelled("the call ended before its write was committed: nothing was written")
        except BaseException:
            try:
                self.con.execute("ROLLBACK")
            except duckdb.Error:
                pass  # no transaction is left to end (DuckDB ended it with the error, or the connection is closed)
            raise
        with duckdb_errors():
            self.con.execute("COMMIT")


class Connections:
    """Connections kept for transactions (by id) and sessions (by session id), and leases for calls."""

    def __init__(self, database: Database, idle_s: float = TRANSACTION_IDLE_S) -> None:
        self.database = database
        self.idle_s = idle_s
        self._kept: dict[bytes | str, Kept] = {}
        self._lock = threading.Lock()

    def begin(self, user: str) -> bytes:
        """Open a Flight transaction for the user; its id."""
        self.expire()
        con = self.database.cursor()
        with duckdb_errors():
            con.execute("BEGIN TRANSACTION")
        transaction = os.urandom(16)
        with self._lock:
            self._kept[transaction] = Kept(con, user, transaction, open=True)
        return transaction

    def end(self, transaction: bytes, user: str, commit: bool) -> None:
        """Commit or roll back a Flight transaction and close its connection (gone even if the commit fails)."""
        kept = self._get(transaction, user, take=True)
        with kept.lock:
            try:
                with duckdb_errors():
                    kept.con.execute("COMMIT" if commit else "ROLLBACK")
            finally:
                kept.con.close()
        if commit:
            self.database.changed()

    def end_session(self, session: str | None) -> None:
        """Close a session's connection, rolling back its open transaction (the session closes)."""
        with self._lock:
            kept = self._kept.pop(session, None) if session is not None else None
        if kept is not None:
            with kept.lock:
                kept.con.close()

    @contextmanager
    def lease(self, transaction: bytes | None, session: str | None, user: str) -> Iterator[Lease]:
        """The connection a call's statements run on: its transaction's, else its session's (one statement at a
        time on either), else a new one, closed after."""
        self.expire()
        if transaction is None and session is None:
            con = self.database.cursor()
            try:
                yield Lease(self.database, con, None)
            finally:
                con.close()
            return
        kept = self._get(transaction, user) if transaction is not None else self._session(session, user)
        with kept.lock:
            try:
                yield Lease(self.database, kept.con, kept)
            finally:
                kept.used = time.monotonic()

    def expire(self) -> None:
        """Close the kept connections idle for longer than idle_s (not one a call is using now)."""
        now = time.monotonic()
        with self._lock:
            idle = [(key, kept) for key, kept in self._kept.items() if now - kept.used > self.idle_s]
        for key, kept in idle:
            if kept.lock.acquire(blocking=False):
                try:
                    self._close(key, kept)
                finally:
                    kept.lock.release()

    def close_all(self) -> None:
        """Close every kept connection, rolling back what is uncommitted (the server is stopping)."""
        with self._lock:
            kept = list(self._kept.items())
        for key, held in kept:
            with held.lock:
                self._close(key, held)

    def _close(self, key: bytes | str, kept: Kept) -> None:
        with self._lock:
            if self._kept.get(key) is not kept:
                return
            del self._kept[key]
        kept.con.close()  # closing a connection rolls back its open transaction

    def _session(self, session: str, user: str) -> Kept:
        """A session's connection, opened at its first statement."""
        with self._lock:
            kept = self._kept.get(session)
            if kept is None:
                kept = self._kept[session] = Kept(self.database.cursor(), user)
        if kept.user != user:
            raise NotFound("unknown session for this user: log in again without the other user's session cookie")
        return kept

    def _get(self, transaction: bytes, user: str, take: bool = False) -> Kept:
        """A Flight transaction's kept connection (`take`: no longer kept); NotFound for another user's."""
        with self._lock:
            kept = self._kept.get(transaction)
            if kept is None or kept.user != user:
                raise NotFound("unknown transaction (ended, rolled back after being idle, or from another server "
                               "run)")
            if take:
                del self._kept[transaction]
        return kept
