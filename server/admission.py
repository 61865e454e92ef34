"""Admission control and per-query limits: how much one server takes on at a time."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from quail.engine.errors import ResourceExhausted
from quail.engine.runtime.query_work import QueryWork


MAX_STATEMENT_BYTES = 1 << 20  # a statement's text, by default


@dataclass(frozen=True)
class Limits:
    """The server's limits on queries: at once, and each one's work and text.

    max_active: queries running or waiting for the model at once; per query: model requests, their
    prompts' tokens, seconds, the tokens generation may choose, and the bytes of its text (UTF-8)."""

    max_active: int = 64
    max_requests: int | None = None
    timeout_s: float | None = None
    max_tokens: int | None = None
    max_generated_tokens: int | None = None
    max_statement_bytes: int = MAX_STATEMENT_BYTES

    def check(self) -> None:
        """ValueError for a limit that could never let a query run."""
        if self.max_active < 1:
            raise ValueError("--max-active must be at least 1")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError("--max-requests must be at least 1")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError("--max-tokens must be at least 1")
        if self.max_generated_tokens is not None and self.max_generated_tokens < 1:
            raise ValueError("--max-generated-tokens must be at least 1")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError("--query-timeout must be a positive number of seconds")
        if self.max_statement_bytes < 1:
            raise ValueError("--max-statement-bytes must be at least 1")

    def check_text(self, text: str) -> None:
        """ResourceExhausted for a statement longer than max_statement_bytes (refused before it is parsed)."""
        size = len(text.encode())
        if size > self.max_statement_bytes:
            raise ResourceExhausted(f"the statement is {size:,} bytes: this server takes at most "
                                    f"{self.max_statement_bytes:,} (--max-statement-bytes)")

    def work(self, since: float | None = None) -> QueryWork:
        """A query's work record, carrying its limits; its time limit counts from `since` (time.monotonic();
        None: now)."""
        start = time.monotonic() if since is None else since
        deadline = start + self.timeout_s if self.timeout_s is not None else None
        return QueryWork(deadline=deadline, max_requests=self.max_requests, max_tokens=self.max_tokens,
                         max_generated_tokens=self.max_generated_tokens)


class Admission:
    """Counts the queries being executed; one past the limit is refused (RESOURCE_EXHAUSTED), not queued."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._active = 0

    def spare(self) -> bool:
        """Whether one more query leaves at least half the limit free: room to run a prepared query ahead
        of its DoGet (statements.HeadStart) without refusing the queries that come meanwhile (never
        under a limit of one)."""
        with self._lock:
            return 2 * (self._active + 1) <= self.limit

    @contextmanager
    def admit(self) -> Iterator[None]:
        with self._lock:
            if self._active >= self.limit:
                raise ResourceExhausted(f"the server is busy: {self.limit} queries are running or waiting for "
                                        f"the model (--max-active); try again later")
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
