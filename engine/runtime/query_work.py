"""The model work of one query: its requests, what the runtime computed, and the ideal plan's work."""

from __future__ import annotations

import itertools
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from quail.engine.errors import Cancelled, DeadlineExceeded, ResourceExhausted
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.radix import ideal_stats
from quail.engine.runtime.requests import Request


@dataclass
class QueryWork:
    """Filled as a query runs; `ideal()` is the least work for the same requests.

    stages: one entry per AI operator: rows in and out, provided and observed selectivity.
    decoded: the least work of decoding what the query generated (decode.ideal), beside its prompts'.
    `cancel()` (from any thread) stops the query at its next step or forward pass, as
    passing `deadline` (time.monotonic() seconds) does; `max_requests` bounds its model requests,
    `max_tokens` their prompts' tokens (logical: every prompt in full) and `max_generated_tokens` the
    tokens generation may choose (checked before every pass, as cancellation is). Requests and tokens
    may be counted from several threads at once (a streamed query queues a chunk while finishing the last).
    `under_way` is set once the host has queued the opening layers of a forward pass holding the query's
    rows (ModelRunner.for_query): from then the device has the query's work in hand. `stops_with`: another
    query's check this work's checks run first (an embedding model's passes for a statement's function:
    they stop when the statement does, counted apart from it).
    """

    stats: Stats = field(default_factory=Stats)
    requests: list[Request] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)
    decoded: Stats = field(default_factory=Stats)
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    under_way: threading.Event = field(default_factory=threading.Event, repr=False)
    deadline: float | None = None
    max_requests: int | None = None
    max_tokens: int | None = None
    max_generated_tokens: int | None = None
    announced: int = 0  # requests counted (`announce`) that have not reached the runtime yet
    stops_with: Callable[[], None] | None = field(default=None, repr=False)
    _interrupts: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def cancel(self) -> None:
        self.cancelled.set()
        with self._lock:
            interrupts = list(self._interrupts)
        for interrupt in interrupts:
            interrupt()

    @contextmanager
    def interruptible(self, interrupt: Callable[[], None]) -> Iterator[None]:
        """While inside, `interrupt` (stopping work that cannot check: a DuckDB statement) is called at once
        when the query is cancelled or when it passes its deadline."""
        timer = None
        if self.deadline is not None:
            timer = threading.Timer(max(0.0, self.deadline - time.monotonic()), interrupt)
            timer.daemon = True
            timer.start()
        with self._lock:
            self._interrupts.append(interrupt)
        try:
            if self.cancelled.is_set():
                interrupt()
            yield
        finally:
            with self._lock:
                self._interrupts.remove(interrupt)
            if timer is not None:
                timer.cancel()

    def check(self) -> None:
        """Raise Cancelled once the query has been cancelled, DeadlineExceeded once past its deadline,
        ResourceExhausted once it has generated more tokens than its limit (`stops_with` checked first)."""
        if self.stops_with is not None:
            self.stops_with()
        if self.cancelled.is_set():
            raise Cancelled("the query was cancelled")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise DeadlineExceeded("the query ran past its time limit (the server's --query-timeout)")
        if self.max_generated_tokens is not None and self.stats.generated_tokens > self.max_generated_tokens:
            raise ResourceExhausted(f"the query generates more than {self.max_generated_tokens:,} tokens "
                                    f"(the server's --max-generated-tokens per query)")

    def announce(self, requests: int) -> None:
        """Count a step's requests before they reach the runtime in parts (progress shows the step's all at
        once); ResourceExhausted before any of them runs if they would pass the query's limit."""
        with self._lock:
            self._count(requests)
            self.announced += requests

    def count(self, requests: int) -> None:
        """Count requests handed to the runtime, those announced already once; ResourceExhausted when the
        query would pass its limit."""
        with self._lock:
            self._count(requests)

    def _count(self, requests: int) -> None:
        taken = min(requests, self.announced)
        self.announced -= taken
        if self.max_requests is not None and self.stats.requests + requests - taken > self.max_requests:
            raise ResourceExhausted(f"the query asks the model more than {self.max_requests} times "
                                    f"(the server's --max-requests per query)")
        self.stats.requests += requests - taken

    def check_tokens(self, tokens: int) -> None:
        """ResourceExhausted if prompts of this many more tokens would pass the query's limit."""
        if self.max_tokens is not None and self.stats.logical_tokens + tokens > self.max_tokens:
            raise ResourceExhausted(f"the query's prompts come to more than {self.max_tokens:,} tokens "
                                    f"(the server's --max-tokens per query)")

    def spend_tokens(self, tokens: int) -> None:
        """Count prompts of this many tokens (checked against the limit first)."""
        with self._lock:
            self.check_tokens(tokens)
            self.stats.logical_tokens += tokens

    def ideal(self) -> Stats:
        """Each distinct prefix of all the query's prompts computed once (unlimited KV, nothing resident
        before the query: KV kept from earlier queries can make the fresh tokens fewer, the regret 0), and
        what it generated decoded with no step wasted."""
        return ideal_stats(self.requests).plus(self.decoded) if self.requests else Stats().plus(self.decoded)

    def report(self, wall_s: float, sol: Callable[[Stats], float | None] | None = None) -> dict[str, Any]:
        """The figures of a query's report: tokens, KV regret, stages, and speed-of-light seconds (if known)."""
        stats, ideal = self.stats, self.ideal()
        return {"wall_s": wall_s, "logical_tokens": stats.logical_tokens, "fresh_tokens": stats.fresh_tokens,
                "cached_tokens": stats.cached_tokens, "padded_tokens": stats.padded_tokens,
                "physical_tokens": stats.physical_tokens, "kv_regret_tokens": max(0, stats.fresh_tokens - ideal.fresh_tokens),
                "generated_tokens": stats.generated_tokens, "decode_steps": stats.decode_steps,
                "requests": stats.requests, "forward_passes": stats.forward_passes, "stages": self.stages,
                "host_restored_tokens": stats.host_restored_tokens,
                "disk_restored_tokens": stats.disk_restored_tokens,
                "ideal": ideal.as_dict(), "sol_s": sol(ideal) if sol is not None else None}


WORK_VARIABLE = "quail_work"  # the DuckDB variable by which a statement passes its work's key to the functions it calls


class Works:
    """The work records of queries under way, each under a key while held.

    - How a function DuckDB runs for a statement (a similarity join's pairs: engine/exec/embedding_functions.py),
      which is not told whose it is, finds the query's record to stop with it: the statement passes the key
      (engine/exec/relational.py).
    - A key is never given twice: one left behind (on a connection) finds nothing once dropped.

    >>> works = Works()
    >>> key = works.hold(QueryWork())
    >>> works.find(key) is not None, works.find("another"), works.find(None)
    (True, None, None)
    >>> works.drop(key); works.find(key) is None
    True
    """

    def __init__(self) -> None:
        self._held: dict[str, QueryWork] = {}
        self._keys = itertools.count(1)
        self._lock = threading.Lock()

    def hold(self, work: QueryWork) -> str:
        """A new key that finds `work` until dropped."""
        with self._lock:
            key = str(next(self._keys))
            self._held[key] = work
            return key

    def drop(self, key: str) -> None:
        with self._lock:
            self._held.pop(key, None)

    def find(self, key: str | None) -> QueryWork | None:
        """The work held under `key` (None: none is, or no key)."""
        with self._lock:
            return self._held.get(key) if key is not None else None
