"""Runtime replicas as Ray actors, so replicas can live on other hosts.

- `--ray ADDRESS`, or `auto`: a local Ray started here; needs the `ray` extra;
- Ray restarts an actor whose process dies.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

import numpy as np
import ray
from ray.exceptions import RayActorError, RayTaskError

from quail.engine.model.config import EngineConfig
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.replica_worker import ReplicaWorker
from quail.engine.runtime.replicas import START_S, ReplicaLost, portable, replica_error, restarting
from quail.engine.runtime.requests import Request

if TYPE_CHECKING:
    from quail.engine.runtime.decode import Decoding

log = logging.getLogger("quail.replicas")

CONCURRENCY = 64  # batches an actor (a ReplicaWorker) scores at once, on threads of its own
PING_S = 1.0  # how often a lost actor is asked whether Ray has restarted it
START_ATTEMPTS = 5  # tries at starting a local Ray
GCS_WAIT = "RAY_gcs_server_port_wait_time_s"  # seconds Ray waits for its GCS to come up


def connect(config: EngineConfig) -> None:
    """Connect to the cluster at `config.ray`, or start a local one here ("auto") with the GPUs but the
    server's own for the actors; nothing when connected already. A server connects before it starts
    threads of its own (gRPC's among them): Ray forks its processes and runs Python code in the child
    before it starts the program, which can fail in a process that runs other threads."""
    if ray.is_initialized():
        return
    if config.ray == "auto":
        import torch

        _start_local(max(0, torch.cuda.device_count() - 1) if config.device.startswith("cuda") else 0)
    else:
        ray.init(address=config.ray, include_dashboard=False, log_to_driver=False)


def replicas(config: EngineConfig, count: int) -> list["RayReplica"]:
    """Replicas 1..count-1 as actors (not yet started), Ray connected first (`connect`)."""
    connect(config)
    gpu = config.device.startswith("cuda")
    actor_config = replace(config, device="cuda" if gpu else "cpu", replicas=1, ray=None)
    return [RayReplica(i, actor_config, gpu) for i in range(1, count)]


def disconnect() -> None:
    """Leave the Ray cluster (a local one started here stops)."""
    ray.shutdown()


def _start_local(gpus: int, attempts: int = START_ATTEMPTS) -> None:
    """Start a local Ray with these GPUs for the actors, trying again when a start fails, up to `attempts`
    times. A start that fails waits out Ray's wait for its GCS first, and a busy host can miss Ray's 30 s:
    the waits are 30, 60, then 120 s (GCS_WAIT in the environment, when set, is every attempt's)."""
    fixed = os.environ.get(GCS_WAIT)
    try:
        for attempt in range(1, attempts + 1):
            os.environ[GCS_WAIT] = fixed or str(min(120, 30 << (attempt - 1)))
            started = time.monotonic()
            try:
                ray.init(num_gpus=gpus, include_dashboard=False, log_to_driver=False)
                return
            except Exception as err:  # noqa: BLE001 — Ray raises bare Exceptions and RuntimeErrors for it
                if attempt == attempts:
                    raise
                log.warning("the local Ray did not start in %.0f s (attempt %d of %d: %s): starting it again",
                            time.monotonic() - started, attempt, attempts, err)
                ray.shutdown()
    finally:
        if fixed is None:
            del os.environ[GCS_WAIT]


class RayReplica:
    """A replica as a Ray actor.

    (replicas.Replica). Ray restarts its process when it dies (the batches it
    had fail with ReplicaLost and run elsewhere); the replica counts as down until the restarted actor
    answers."""

    def __init__(self, index: int, config: EngineConfig, gpu: bool) -> None:
        self.index, self.config, self.gpu = index, config, gpu
        self.up, self.stopped, self.restarts = False, False, 0
        self.computed = Stats()
        self.actor = None
        self._jobs: dict[int, Future] = {}
        self._next = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        actor_class = ray.remote(num_gpus=1 if self.gpu else 0, num_cpus=1, max_restarts=-1, max_task_retries=0,
                                 max_concurrency=CONCURRENCY)(ReplicaWorker)
        self.actor = actor_class.options(name=f"quail-replica-{self.index}-{os.getpid()}").remote(self.config)
        log.info("replica %d: %s, a Ray actor", self.index, ray.get(self.actor.ready.remote(), timeout=START_S))
        self.up = True

    def submit(self, requests: Sequence[Request], decoding: "Decoding | None" = None) -> Future:
        future: Future = Future()
        with self._lock:
            if not self.up:
                return restarting(self.index)
            job, self._next = self._next, self._next + 1
            self._jobs[job] = future
        self.actor.submit.remote(job, list(requests), *portable(decoding)).future().add_done_callback(
            lambda done: self._answered(job, done))
        return future

    def resident(self, prompts: list[np.ndarray]) -> Future:
        if not self.up:
            return restarting(self.index)
        return self.actor.resident.remote(prompts).future()

    def busy(self) -> Future:
        if not self.up:
            return restarting(self.index)
        return self.actor.busy.remote().future()

    def _answered(self, job: int, done: Future) -> None:
        with self._lock:
            future = self._jobs.pop(job)
        error = done.exception()
        if error is None:
            answers, stats = done.result()
            with self._lock:
                self.computed = self.computed.plus(stats)
            future.set_result((answers, stats))
        elif isinstance(error, RayActorError):
            future.set_exception(ReplicaLost(f"replica {self.index} ended"))
            self._lost()
        elif isinstance(error, RayTaskError):
            cause = error.cause
            future.set_exception(replica_error(self.index, type(cause).__name__, str(cause)))
        else:
            future.set_exception(replica_error(self.index, type(error).__name__, str(error)))

    def _lost(self) -> None:
        """The actor's process died: down until Ray's restart of it answers."""
        with self._lock:
            if not self.up or self.stopped:
                return
            self.up = False
        log.warning("replica %d ended: its batches run elsewhere; Ray restarts it", self.index)
        threading.Thread(target=self._wait_restart, name=f"quail-replica-{self.index}-restart", daemon=True).start()

    def _wait_restart(self) -> None:
        while not self.stopped:
            try:
                ray.get(self.actor.ready.remote(), timeout=START_S)
            except Exception:  # noqa: BLE001 — not back yet
                time.sleep(PING_S)
                continue
            with self._lock:
                self.up, self.restarts = not self.stopped, self.restarts + 1
            log.info("replica %d restarted", self.index)
            return

    def cancel(self, future: Future) -> None:
        with self._lock:
            job = next((k for k, f in self._jobs.items() if f is future), None)
        if job is not None and self.up:
            self.actor.cancel.remote(job)

    def forget(self, rejected: Sequence[Request], accepted: Sequence[Request]) -> None:
        if self.up:
            self.actor.forget.remote(list(rejected), list(accepted))

    def stop(self) -> None:
        with self._lock:
            self.up, self.stopped = False, True
        if self.actor is not None:
            ray.kill(self.actor, no_restart=True)
