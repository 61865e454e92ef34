"""Server-side statement state: prepared statements, planned queries awaiting their DoGet, running queries."""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa

from quail.engine.errors import Cancelled, NotFound
from quail.engine.physical import PhysicalPlan
from quail.engine.work import QueryWork
from quail.planner.updates import UpdatePlan

from .flight_messages import CANCEL_STATUS_CANCELLED, CANCEL_STATUS_CANCELLING, CANCEL_STATUS_NOT_CANCELLABLE


@dataclass
class Running:
    """A query being executed: its work record (progress, cancel), text, user and start time."""

    work: QueryWork
    query: str
    user: str
    started: float = field(default_factory=time.time)


@dataclass
class PreparedStatement:
    """A query text and the parameter values last bound to it (None: none bound)."""

    query: str
    params: list[Any] | None = None


class Statements:
    """Handles are random 16-byte strings; pending queries are kept for a bounded number of tickets."""

    def __init__(self, new_work: Callable[[], QueryWork] = QueryWork, max_pending: int = 4096) -> None:
        self._new_work = new_work
        self._lock = threading.Lock()
        self._prepared: dict[bytes, PreparedStatement] = {}
        self._pending: OrderedDict[bytes, tuple[PhysicalPlan | UpdatePlan, pa.Schema, str]] = OrderedDict()
        self._running: dict[bytes, Running] = {}
        self._cancelled: OrderedDict[bytes, None] = OrderedDict()  # tickets cancelled before they were redeemed
        self._max_pending = max_pending

    def prepare(self, query: str) -> bytes:
        handle = os.urandom(16)
        with self._lock:
            self._prepared[handle] = PreparedStatement(query)
        return handle

    def prepared(self, handle: bytes) -> PreparedStatement:
        with self._lock:
            statement = self._prepared.get(handle)
        if statement is None:
            raise NotFound("unknown prepared statement handle (closed, or from another server run)")
        return statement

    def bind(self, handle: bytes, params: list[Any]) -> None:
        self.prepared(handle).params = params

    def close(self, handle: bytes) -> None:
        with self._lock:
            if self._prepared.pop(handle, None) is None:
                raise NotFound("unknown prepared statement handle")

    def add_pending(self, plan: PhysicalPlan | UpdatePlan, schema: pa.Schema, query: str) -> bytes:
        """Keep a planned query until its ticket is redeemed; the oldest go first when full."""
        handle = os.urandom(16)
        with self._lock:
            self._pending[handle] = (plan, schema, query)
            while len(self._pending) > self._max_pending:
                self._pending.popitem(last=False)
        return handle

    def start(self, handle: bytes, user: str) -> tuple[PhysicalPlan | UpdatePlan, pa.Schema, QueryWork]:
        """Redeem a ticket: its plan and schema, and the work record that cancelling it stops."""
        work = self._new_work()
        with self._lock:
            entry = self._pending.pop(handle, None)
            if entry is not None:
                self._running[handle] = Running(work, entry[2], user)
            cancelled = self._cancelled.pop(handle, False) is None
        if cancelled:
            raise Cancelled("the query was cancelled before it ran")
        if entry is None:
            raise NotFound("unknown or already redeemed ticket")
        return entry[0], entry[1], work

    def begin(self, query: str, user: str) -> tuple[bytes, QueryWork]:
        """Register a statement run without a ticket (a DoPut update): its handle and work record."""
        handle, work = os.urandom(16), self._new_work()
        with self._lock:
            self._running[handle] = Running(work, query, user)
        return handle, work

    def running(self) -> dict[bytes, Running]:
        """The statements being executed, by handle."""
        with self._lock:
            return dict(self._running)

    def finish(self, handle: bytes) -> None:
        with self._lock:
            self._running.pop(handle, None)

    def cancel(self, handle: bytes) -> int:
        """Cancel a query by its ticket's handle: a Flight CancelStatus."""
        with self._lock:
            if self._pending.pop(handle, None) is not None:
                self._cancelled[handle] = None
                while len(self._cancelled) > self._max_pending:
                    self._cancelled.popitem(last=False)
                return CANCEL_STATUS_CANCELLED
            running = self._running.get(handle)
        if running is None:
            return CANCEL_STATUS_NOT_CANCELLABLE
        running.work.cancel()
        return CANCEL_STATUS_CANCELLING
