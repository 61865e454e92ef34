"""Server-side statement state, from preparing to the last row.

Prepared statements, planned queries awaiting their DoGet, running queries, and
prepared queries already running (head starts).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Generic, TypeVar

import pyarrow as pa

from quail.engine.errors import Cancelled, NotFound
from quail.engine.exec.plan import PhysicalPlan, ai_steps
from quail.engine.runtime.query_work import QueryWork

from quail.server.flight_messages import CANCEL_STATUS_CANCELLED, CANCEL_STATUS_CANCELLING, CANCEL_STATUS_NOT_CANCELLABLE
from quail.server.read_ahead import ReadAhead


T = TypeVar("T")


@dataclass
class Running:
    """A query being executed: its work record (progress, cancel), text, user and start time."""

    work: QueryWork
    query: str
    user: str
    started: float = field(default_factory=time.time)


PLAN_HOLDS_S = 2.0  # a prepared AI query's plan runs it this long after it was made (its costs read the KV pool)


@dataclass(frozen=True)
class Kept:
    """A prepared query's plan and result schema, and what they were made under.

    The catalog's version,
    the session's dialect, and when (the KV pool its join orders were costed against changes)."""

    plan: PhysicalPlan
    schema: pa.Schema
    version: int
    dialect: str
    at: float = field(default_factory=time.monotonic)

    def holds(self, version: int, dialect: str) -> bool:
        """Whether it is the plan the query would get now: made over the same tables in the same dialect, and, where
        it asks the model, recently (its join orders were priced with the KV pool of then)."""
        return (version, dialect) == (self.version, self.dialect) and (
            not ai_steps(self.plan.steps) or time.monotonic() - self.at < PLAN_HOLDS_S)


@dataclass
class HeadStart:
    """A prepared query of no parameters, run from the moment it was prepared.

    ADBC and JDBC run a statement
    right after preparing it, so its first batch is computed while the client asks for its FlightInfo and
    its ticket, and its DoGet reads on from there (`batches`: made ahead of the DoGet, the stream's end
    while the DoGet sends the last batch). `handle`: its running entry, then the ticket of its first
    FlightInfo; `version`: the catalog's when it began (a query that would read another runs afresh)."""

    handle: bytes
    work: QueryWork
    batches: ReadAhead[pa.RecordBatch]
    version: int
    at: float = field(default_factory=time.monotonic)

    def stop(self) -> None:
        """Cancel its work and end its stream (its running entry and admission go) once the batch being made
        is done."""
        self.work.cancel()
        self.batches.close()


@dataclass
class PreparedStatement:
    """A prepared statement: its text, its last bound parameters, its plan.

    A query text and the rows of parameter values last bound to it (None: none bound); `planned`: the
    plan a query of no parameters got when it was prepared (a client runs it at once: it is not made
    twice); `head`: the handle of its head start, until its first FlightInfo; `transaction`: the
    transaction it was prepared in, which it runs in (None: none); `user`: who prepared it (only they may
    use it)."""

    query: str
    params: pa.Table | None = None
    planned: Kept | None = None
    head: bytes | None = None
    transaction: bytes | None = None
    user: str = "-"


class Held(Generic[T]):
    """Entries by handle, bounded by count and bytes, least recently used first.

    Entries by handle, least recently used first, bounded by count and by their estimated bytes: the
    least recently used go when a new one would pass either bound."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count, self.max_bytes = max_count, max_bytes
        self._entries: OrderedDict[bytes, tuple[T, int]] = OrderedDict()
        self._bytes = 0

    def put(self, handle: bytes, entry: T, size: int) -> None:
        self._entries[handle] = (entry, size)
        self._bytes += size
        while len(self._entries) > self.max_count or (self._bytes > self.max_bytes and len(self._entries) > 1):
            _, (_, dropped) = self._entries.popitem(last=False)
            self._bytes -= dropped

    def get(self, handle: bytes) -> T | None:
        """An entry, now the most recently used."""
        if handle not in self._entries:
            return None
        self._entries.move_to_end(handle)
        return self._entries[handle][0]

    def pop(self, handle: bytes) -> T | None:
        found = self._entries.pop(handle, None)
        if found is None:
            return None
        self._bytes -= found[1]
        return found[0]

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(frozen=True)
class Pending:
    """A planned query awaiting its ticket.

    Its plan and result schema, its text, the transaction it runs in
    (None: none), when its time limit started (its planning's start; None: when the ticket is redeemed), and
    the user who planned it (only they may redeem or cancel it)."""

    plan: PhysicalPlan
    schema: pa.Schema
    query: str
    transaction: bytes | None
    since: float | None
    user: str


def _no_limits(since: float | None) -> QueryWork:
    """A work record with no limits (the time limit's start does not matter)."""
    return QueryWork()


def _plan_bytes(query: str) -> int:
    """A planned statement's memory, estimated from its text (its plan's SQL steps repeat the text)."""
    return 4 * len(query) + 4096


def _unknown_prepared() -> NotFound:
    return NotFound("unknown prepared statement handle (closed, from another server run, or released as the "
                    "least recently used of too many open ones)")


class Statements:
    """The server's statements by handle, each its user's.

    Handles are random 16-byte strings. Prepared statements, planned queries awaiting their ticket, and
    results awaiting theirs are each bounded by count and estimated bytes: the least recently used go
    first (a later use of a handle that went gets NOT_FOUND). A head start not taken up by a DoGet within
    PLAN_HOLDS_S (the client closed its statement, or never ran it) is stopped at the next prepare or
    FlightInfo. Each belongs to the user who made it: to another user its handle is unknown (NOT_FOUND),
    and cancelling it does nothing."""

    def __init__(self, new_work: Callable[[float | None], QueryWork] = _no_limits, max_count: int = 4096,
                 max_bytes: int = 256 << 20) -> None:
        self._new_work = new_work
        self._lock = threading.Lock()
        self._prepared: Held[PreparedStatement] = Held(max_count, max_bytes)
        self._pending: Held[Pending] = Held(max_count, max_bytes)
        self._results: Held[tuple[pa.Table, str]] = Held(max_count, max_bytes)
        self._running: dict[bytes, Running] = {}
        self._cancelled: OrderedDict[bytes, None] = OrderedDict()  # tickets cancelled before they were redeemed
        self._max_cancelled = max_count
        self._heads: OrderedDict[bytes, HeadStart] = OrderedDict()  # not taken up yet, oldest first

    def prepare(self, query: str, user: str, planned: Kept | None = None, head: HeadStart | None = None,
                transaction: bytes | None = None) -> bytes:
        handle = os.urandom(16)
        with self._lock:
            self._prepared.put(handle, PreparedStatement(query, planned=planned,
                                                         head=head.handle if head is not None else None,
                                                         transaction=transaction, user=user),
                               _plan_bytes(query))
            if head is not None:
                self._heads[head.handle] = head
        self._stop_expired()
        return handle

    def _stop_expired(self) -> None:
        """Stop the head starts older than PLAN_HOLDS_S (outside the lock: a stopped stream ends its run)."""
        expired = []
        with self._lock:
            while self._heads and time.monotonic() - next(iter(self._heads.values())).at >= PLAN_HOLDS_S:
                expired.append(self._heads.popitem(last=False)[1])
        for head in expired:
            head.stop()

    def stop_head(self, handle: bytes | None) -> None:
        """Stop a head start not taken up (nothing if it was, or is gone)."""
        with self._lock:
            head = self._heads.pop(handle, None) if handle is not None else None
        if head is not None:
            head.stop()

    def prepared(self, handle: bytes, user: str) -> PreparedStatement:
        with self._lock:
            statement = self._prepared.get(handle)
        if statement is None or statement.user != user:
            raise _unknown_prepared()
        return statement

    def bind(self, handle: bytes, params: pa.Table | None, user: str) -> None:
        with self._lock:
            statement = self._prepared.get(handle)
            if statement is None or statement.user != user:
                raise _unknown_prepared()
            statement.params = params
            self._prepared.pop(handle)
            size = _plan_bytes(statement.query) + (params.nbytes if params is not None else 0)
            self._prepared.put(handle, statement, size)

    def close(self, handle: bytes, user: str) -> None:
        with self._lock:
            statement = self._prepared.get(handle)
            if statement is None or statement.user != user:
                raise NotFound("unknown prepared statement handle")
            self._prepared.pop(handle)
        self.stop_head(statement.head)

    def take_head(self, statement: PreparedStatement) -> bytes | None:
        """The handle of a prepared statement's head start, for its first FlightInfo's ticket (None after)."""
        with self._lock:
            handle, statement.head = statement.head, None
        return handle

    def add_pending(self, plan: PhysicalPlan, schema: pa.Schema, query: str, user: str, handle: bytes | None = None,
                    transaction: bytes | None = None, since: float | None = None) -> bytes:
        """Keep a planned query until its ticket is redeemed by `user`; `handle`: the ticket's (a head
        start's); `transaction`: the transaction it runs in (None: none); `since`: when its time limit started
        (its planning's start; None: when the ticket is redeemed)."""
        handle = handle or os.urandom(16)
        with self._lock:
            self._pending.put(handle, Pending(plan, schema, query, transaction, since, user), _plan_bytes(query))
        self._stop_expired()
        return handle

    def add_result(self, table: pa.Table, user: str) -> bytes:
        """Keep the result of a statement `user` ran until its ticket is redeemed (or never: a client that does
        not fetch an update's row count)."""
        handle = os.urandom(16)
        with self._lock:
            self._results.put(handle, (table, user), table.nbytes)
        return handle

    def take_result(self, handle: bytes, user: str) -> pa.Table | None:
        """A kept result, redeemed by its ticket (None: the ticket names no result kept for this user)."""
        with self._lock:
            found = self._results.get(handle)
            if found is None or found[1] != user:
                return None
            return self._results.pop(handle)[0]

    def start(self, handle: bytes, user: str, version: int
              ) -> tuple[PhysicalPlan, pa.Schema, QueryWork, HeadStart | None, bytes | None]:
        """Redeem a ticket: its plan and schema, the work record that cancelling it stops, its head start
        where one runs over the catalog's `version` (one over another is stopped: the query runs afresh), and
        the transaction it runs in."""
        stale = None
        with self._lock:
            found = self._pending.get(handle)
            if found is not None and found.user != user:
                raise NotFound("unknown or already redeemed ticket")
            entry = self._pending.pop(handle)
            head = self._heads.pop(handle, None)
            if head is not None and (entry is None or head.version != version):
                stale, head = head, None
            work = head.work if head is not None else self._new_work(entry.since if entry is not None else None)
            if entry is not None and head is None:
                self._running[handle] = Running(work, entry.query, user)
            cancelled = self._cancelled.pop(handle, False) is None
        if stale is not None:
            stale.stop()
        if cancelled:
            raise Cancelled("the query was cancelled before it ran")
        if entry is None:
            raise NotFound("unknown or already redeemed ticket")
        return entry.plan, entry.schema, work, head, entry.transaction

    def begin(self, query: str, user: str, since: float | None = None) -> tuple[bytes, QueryWork]:
        """Register a statement run without a ticket (a DoPut update): its handle and work record (`since`: when
        its time limit started; None: now)."""
        handle, work = os.urandom(16), self._new_work(since)
        with self._lock:
            self._running[handle] = Running(work, query, user)
        return handle, work

    def running(self) -> dict[bytes, Running]:
        """The statements being executed, by handle."""
        with self._lock:
            return dict(self._running)

    def finish(self, handle: bytes, work: QueryWork) -> None:
        """A statement's run ended: its running entry goes (unless the handle now names another run's)."""
        with self._lock:
            if handle in self._running and self._running[handle].work is work:
                del self._running[handle]

    def cancel(self, handle: bytes, user: str | None) -> int:
        """Cancel a query of `user`'s (None: of anyone's, for an admin) by its ticket's handle: a Flight
        CancelStatus (NOT_CANCELLABLE for another user's)."""
        with self._lock:
            entry = self._pending.get(handle) or self._running.get(handle)
            if user is not None and entry is not None and entry.user != user:
                return CANCEL_STATUS_NOT_CANCELLABLE
            pending = self._pending.pop(handle) is not None
            if pending:
                self._cancelled[handle] = None
                while len(self._cancelled) > self._max_cancelled:
                    self._cancelled.popitem(last=False)
            running = self._running.get(handle)
        if pending:
            self.stop_head(handle)
            return CANCEL_STATUS_CANCELLED
        if running is None:
            return CANCEL_STATUS_NOT_CANCELLABLE
        running.work.cancel()
        return CANCEL_STATUS_CANCELLING
