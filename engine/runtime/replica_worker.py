"""A replica where it runs (a process of its own, a Ray actor): its runtime, and the batches it computes.

- `ReplicaWorker`: loads and warms the model; scores or decodes request batches on the caller's threads.
- `serve_replica`: a replica process's life over its pipe (ProcessReplica starts it).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

import numpy as np

from quail.engine.model.config import EngineConfig
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.loading import load_runtime
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.requests import Request

if TYPE_CHECKING:
    from quail.engine.runtime.decode import Decoding


class ReplicaWorker:
    """The runtime of a replica, where it runs.

    (a process of its own, a Ray actor): loads and warms the
    model, scores or decodes request batches (on threads of the caller's: its scheduler packs them into shared
    passes), stops a batch its query cancelled."""

    def __init__(self, config: EngineConfig) -> None:
        self.runtime = load_runtime(config)
        self.runtime.warm_up()
        self.device = config.device
        self.works: dict[int, QueryWork] = {}

    def ready(self) -> str:
        return f"{self.runtime.model_id} on {self.device} (pid {os.getpid()})"

    def submit(self, job: int, requests: list[Request], decoding: "Decoding | None" = None,
               schema: str | None = None) -> tuple[list, Stats]:
        """The batch's log-probabilities, or with `decoding` (and the JSON `schema` it follows: `portable`) the
        tokens it gives after each; and what computing them cost here."""
        self.works[job] = work = QueryWork()
        try:
            if decoding is None:
                return self.runtime.launch(requests, work).read(), work.stats
            if schema is not None:
                decoding = replace(decoding, schema=self.runtime.schema(schema))
            return self.runtime.generate(requests, decoding, work), work.stats
        finally:
            self.works.pop(job, None)

    def cancel(self, job: int) -> None:
        work = self.works.get(job)
        if work is not None:
            work.cancel()

    def forget(self, rejected: list[Request], accepted: list[Request]) -> None:
        self.runtime.forget(rejected, accepted)

    def resident(self, prompts: list[np.ndarray]) -> tuple[list[int], Stats]:
        """How long a prefix of each prompt the resident tree holds (nothing when there is none), at no cost."""
        tree = self.runtime.runner.tree
        return [tree.resident_length(p) if tree is not None else 0 for p in prompts], Stats()

    def busy(self) -> tuple[float, Stats]:
        """The device's busy seconds so far (DeviceTime), at no cost."""
        return self.runtime.scheduler.busy.seconds(), Stats()


def serve_replica(config: EngineConfig, conn) -> None:
    """A replica process's life: a ReplicaWorker, ready, then each batch computed on a thread of its own until
    the pipe closes."""
    try:
        worker = ReplicaWorker(config)
    except BaseException as err:  # noqa: BLE001 — the coordinator reports it
        conn.send(("failed", f"{type(err).__name__}: {err}"))
        return
    conn.send(("ready", worker.ready()))
    send_lock = threading.Lock()

    def answer(job: int, call: Callable[..., tuple], *args) -> None:
        """The job's answer and cost, or the error it raised, sent back."""
        try:
            message = ("done", job, *call(*args))
        except BaseException as err:  # noqa: BLE001 — the coordinator raises it in the query
            message = ("failed", job, type(err).__name__, str(err))
        with send_lock:
            conn.send(message)

    with ThreadPoolExecutor(max_workers=64, thread_name_prefix="quail-replica-job") as pool:
        while True:
            try:
                kind, *rest = conn.recv()
            except (EOFError, OSError):
                return
            if kind == "submit":
                pool.submit(answer, rest[0], worker.submit, *rest)
            elif kind == "resident":
                pool.submit(answer, rest[0], worker.resident, *rest[1:])
            elif kind == "busy":
                pool.submit(answer, rest[0], worker.busy)
            elif kind == "cancel":
                worker.cancel(*rest)
            elif kind == "forget":
                worker.forget(*rest)
