"""Turns on the device: forward passes of concurrent queries run one at a time, first come first served."""

from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager
from typing import Iterator


class Turns:
    """A first-in first-out lock: each waiting query gets the device once before any query gets it again.

    A query takes a turn per forward pass, so a short query admitted while a
    long one runs waits one pass, not the long query's whole step.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: deque[threading.Event] = deque()
        self._busy = False

    def waiting(self) -> int:
        """Queries waiting for the device."""
        with self._lock:
            return len(self._waiting)

    @contextmanager
    def turn(self) -> Iterator[None]:
        mine = threading.Event()
        with self._lock:
            if self._busy:
                self._waiting.append(mine)
            else:
                self._busy = True
                mine.set()
        mine.wait()
        try:
            yield
        finally:
            with self._lock:
                if self._waiting:
                    self._waiting.popleft().set()
                else:
                    self._busy = False
