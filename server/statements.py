"""Server-side statement state: prepared statements and planned queries awaiting their DoGet."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from quail.engine.errors import NotFound
import pyarrow as pa

from quail.engine.physical import PhysicalPlan


@dataclass
class PreparedStatement:
    """A query text and the parameter values last bound to it (None: none bound)."""

    query: str
    params: list[Any] | None = None


class Statements:
    """Handles are random 16-byte strings; pending queries are kept for a bounded number of tickets."""

    def __init__(self, max_pending: int = 4096) -> None:
        self._lock = threading.Lock()
        self._prepared: dict[bytes, PreparedStatement] = {}
        self._pending: OrderedDict[bytes, tuple[PhysicalPlan, pa.Schema]] = OrderedDict()
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

    def add_pending(self, plan: PhysicalPlan, schema: pa.Schema) -> bytes:
        """Keep a planned query until its ticket is redeemed; the oldest go first when full."""
        handle = os.urandom(16)
        with self._lock:
            self._pending[handle] = (plan, schema)
            while len(self._pending) > self._max_pending:
                self._pending.popitem(last=False)
        return handle

    def take_pending(self, handle: bytes) -> tuple[PhysicalPlan, pa.Schema]:
        with self._lock:
            entry = self._pending.pop(handle, None)
        if entry is None:
            raise NotFound("unknown or already redeemed ticket")
        return entry
