"""Runtime replicas, one per GPU: each request goes to the replica that holds its document.

- The server's own runtime is replica 0; the others run in processes of their own.
- Requests (to score, or to continue by decoding) follow their document.
- A replica's requests run again on replica 0 when its process dies, while it restarts.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import multiprocessing
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

from quail.engine import errors
from quail.engine.errors import QuailError, Unavailable
from quail.engine.model.config import EngineConfig
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.requests import Request, document_prefix

if TYPE_CHECKING:
    from quail.engine.runtime.decode import Decoding

log = logging.getLogger("quail.replicas")

SKEW = 1.25  # a replica holds at most this times the mean queued tokens while another has room
PLACES = 1 << 20  # documents whose replica the router remembers (least recently routed forgotten first)
POLL_S = 0.05  # how often a query waiting for a replica checks whether it was cancelled
RESIDENT_S = 1.0  # how long planning (or a metrics read) waits for a replica to say what it holds (or its busy time)
START_S = 600.0  # a replica's process has this long to load its model and warm up


def document_key(request: Request) -> bytes:
    """What routes a request: its [preamble][first document]'s key (every question about a document goes
    where its KV is), else the whole prompt's."""
    prefix = document_prefix(request)
    return prefix[1] if prefix is not None else request.prefix(len(request.segments))[1]


class Router:
    """Which replica computes each request, and what each has queued.

    A document goes where it went before (its KV may still be resident there);
    the first time, to the live replica ranking first by rendezvous hash of the
    document's key, so a table's documents spread over the replicas and stay
    put across queries. Load is bounded: a request whose replica would hold
    more than SKEW × the mean queued tokens (this batch's included) goes to the
    least loaded live replica instead, when that one stays within the bound; the
    document is placed there from then on.

    >>> router = Router(2)
    >>> first = router.route([b"doc"], [100], {0, 1})
    >>> router.done(first[0], 100)
    >>> router.route([b"doc"], [100], {0, 1}) == first  # the same document: the same replica
    True
    >>> router.done(first[0], 100)
    >>> router.route([b"doc"], [100], {1 - first[0]}) == [1 - first[0]]  # its replica is down: another
    True
    >>> router = Router(2)
    >>> sorted(router.route([b"a", b"b", b"c", b"d"], [100] * 4, {0, 1}))  # at most 1.25 x 200 tokens each
    [0, 0, 1, 1]
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self.queued = [0] * count
        self.placed: OrderedDict[bytes, int] = OrderedDict()
        self._lock = threading.Lock()

    def route(self, keys: Sequence[bytes], tokens: Sequence[int], live: set[int]) -> list[int]:
        """A live replica for each request (its document's key, its tokens), whose tokens are queued there."""
        with self._lock:
            mean = (sum(self.queued[r] for r in live) + sum(tokens)) / len(live)
            bound = SKEW * mean
            out = []
            for key, size in zip(keys, tokens):
                replica = self.placed.get(key)
                if replica not in live:
                    replica = max(live, key=lambda r: hashlib.blake2b(key + bytes([r]), digest_size=8).digest())
                if self.queued[replica] + size > bound:
                    least = min(live, key=lambda r: self.queued[r])
                    if self.queued[least] + size <= bound:
                        replica = least
                self.placed[key] = replica
                self.placed.move_to_end(key)
                if len(self.placed) > PLACES:
                    self.placed.popitem(last=False)
                self.queued[replica] += size
                out.append(replica)
            return out

    def done(self, replica: int, tokens: int) -> None:
        """Tokens queued on the replica have been computed (or given up)."""
        with self._lock:
            self.queued[replica] -= tokens


class ReplicaLost(Unavailable):
    """The replica's process ended before it answered (its requests are run elsewhere)."""


class Answers(Protocol):
    """Answers being computed on this process's device (runtime.Scoring, runtime.Generated)."""

    def read(self) -> list: ...


class Replica(Protocol):
    """A runtime serving requests away from the server's process (ProcessReplica, ray_replicas.RayReplica)."""

    index: int
    up: bool  # serving: requests may be routed to it
    restarts: int
    computed: Stats  # what the requests it answered cost there, summed

    def start(self) -> None: ...

    def submit(self, requests: Sequence[Request], decoding: "Decoding | None" = None) -> Future: ...

    def resident(self, prompts: list[np.ndarray]) -> Future: ...

    def busy(self) -> Future: ...

    def cancel(self, future: Future) -> None: ...

    def forget(self, rejected: Sequence[Request], accepted: Sequence[Request]) -> None: ...

    def stop(self) -> None: ...


def restarting(index: int) -> Future:
    """The answer of a replica that is down: a future failed with ReplicaLost (its requests run elsewhere)."""
    lost: Future = Future()
    lost.set_exception(ReplicaLost(f"replica {index} is restarting"))
    return lost


def portable(decoding: "Decoding | None") -> tuple["Decoding | None", str | None]:
    """A decoding as it travels to a replica: without its grammar (compiled over this process's vocabulary
    object), and the JSON schema the replica compiles it from again (ReplicaWorker.submit)."""
    if decoding is None or decoding.schema is None:
        return decoding, None
    return replace(decoding, schema=None), decoding.schema.source


def replica_error(index: int, name: str, text: str) -> QuailError:
    """An error a replica raised, by its class name: the same Quail error here (Cancelled, ResourceExhausted,
    ...), any other as a QuailError naming the replica."""
    error = getattr(errors, name, None)
    if isinstance(error, type) and issubclass(error, QuailError):
        return error(text)
    return QuailError(f"replica {index}: {name}: {text}")


class ProcessReplica:
    """A runtime in a process of its own, serving many queries at once.

    A runtime in a process of its own (started with `spawn`, running `serve(config, pipe)`:
    replica_worker.serve_replica), serving many queries at once: each request batch is scored on a thread of
    that process, so its scheduler packs them all into its passes. Restarted again after its process ends
    (`_restart`); jobs it had not answered fail with ReplicaLost."""

    def __init__(self, index: int, config: EngineConfig, serve: Callable[[EngineConfig, Any], None]) -> None:
        self.index, self.config, self.serve = index, config, serve
        self.restarts = 0
        self.up = False
        self.stopped = False
        self.computed = Stats()  # what its queries' requests cost there, summed
        self._jobs: dict[int, Future] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self.process: multiprocessing.process.BaseProcess | None = None
        self._conn = None

    def start(self) -> None:
        """Start the process and wait until its runtime is warm (RuntimeError when it fails to start)."""
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        process = context.Process(target=self.serve, args=(self.config, theirs), daemon=True,
                                  name=f"quail-replica-{self.index}")
        process.start()
        theirs.close()
        if not ours.poll(START_S):
            process.kill()
            raise RuntimeError(f"replica {self.index} did not start within {START_S:.0f} s")
        try:
            message = ours.recv()
        except EOFError:
            raise RuntimeError(f"replica {self.index} exited while it started (exit code {process.exitcode})") from None
        if message[0] != "ready":
            process.kill()
            raise RuntimeError(f"replica {self.index} failed to start: {message[1]}")
        self.process, self._conn, self.up = process, ours, True
        threading.Thread(target=self._read, args=(ours,), name=f"quail-replica-{self.index}-reader",
                         daemon=True).start()
        log.info("replica %d: %s", self.index, message[1])

    def submit(self, requests: Sequence[Request], decoding: "Decoding | None" = None) -> Future:
        """A future of the requests' log-probabilities (with `decoding`: the tokens it gives after each) and what
        computing them cost there (Stats)."""
        return self._ask("submit", list(requests), *portable(decoding))

    def resident(self, prompts: list[np.ndarray]) -> Future:
        """A future of how long a prefix of each prompt the replica's resident tree holds (ReplicaWorker.resident),
        and no cost (Stats())."""
        return self._ask("resident", prompts)

    def busy(self) -> Future:
        """A future of the replica's device busy seconds so far (ReplicaWorker.busy), and no cost."""
        return self._ask("busy")

    def _ask(self, kind: str, *payload) -> Future:
        """A job of this kind sent to the process: a future of its answer and cost (ReplicaLost while down)."""
        job_id, future = next(self._ids), Future()
        with self._lock:
            if not self.up:
                return restarting(self.index)
            self._jobs[job_id] = future
        self._send((kind, job_id, *payload))
        return future

    def cancel(self, future: Future) -> None:
        """Stop the job of this future (its query was cancelled)."""
        with self._lock:
            job_id = next((k for k, job in self._jobs.items() if job is future), None)
        if job_id is not None:
            self._send(("cancel", job_id))

    def forget(self, rejected: Sequence[Request], accepted: Sequence[Request]) -> None:
        """Runtime.forget there."""
        if self.up:
            self._send(("forget", list(rejected), list(accepted)))

    def _restart(self) -> None:
        """Start the process again, trying again after 1, 2, 4, ... 60 s while it fails, until it runs or
        the replica is stopped."""
        for attempt in itertools.count():
            if self.stopped:
                return
            try:
                self.start()
                self.restarts += 1
                return
            except Exception:  # noqa: BLE001 — logged; tried again
                log.exception("replica %d did not restart", self.index)
            time.sleep(min(60, 2 ** attempt))

    def stop(self) -> None:
        with self._lock:
            self.up, self.stopped = False, True
        if self.process is not None:
            self.process.kill()
            self.process.join(10)

    def _send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except (OSError, ValueError, AttributeError):
            self._ended(self._conn)

    def _read(self, conn) -> None:
        while True:
            try:
                kind, job_id, *rest = conn.recv()
            except (EOFError, OSError):
                self._ended(conn)
                return
            with self._lock:
                job = self._jobs.pop(job_id, None)
                if job is not None and kind == "done":
                    self.computed = self.computed.plus(rest[1])
            if job is None:
                continue
            if kind == "done":
                job.set_result(tuple(rest))
            else:
                job.set_exception(replica_error(self.index, *rest))

    def _ended(self, conn) -> None:
        """The process ended (or its pipe broke): every job it had fails with ReplicaLost; it restarts."""
        with self._lock:
            if conn is not self._conn or not self.up or self.stopped:
                return
            self.up = False
            jobs, self._jobs = self._jobs, {}
        log.warning("replica %d ended (exit code %s): %d jobs run elsewhere; restarting", self.index,
                    self.process.exitcode if self.process else None, len(jobs))
        for job in jobs.values():
            job.set_exception(ReplicaLost(f"replica {self.index} ended"))
        threading.Thread(target=self._restart, name=f"quail-replica-{self.index}-restart", daemon=True).start()


class Replicas:
    """Replicas 1..n-1 of a runtime, and the router over all n.

    - Replicas 1..n-1 of a runtime (0 is the caller's own), started here: processes of their own
      (ProcessReplica), or Ray actors (ray_replicas.py); `disconnect` is called once they stopped.
    - The router over all n."""

    def __init__(self, remote: list[Replica], disconnect: Callable[[], None] = lambda: None) -> None:
        self.router = Router(len(remote) + 1)
        self.remote = remote
        self._disconnect = disconnect
        self.here = Stats()  # what replica 0's share cost
        self.rerun = 0  # requests run here again after their replica ended
        self._lock = threading.Lock()
        starting = [threading.Thread(target=_start, args=(replica,)) for replica in self.remote]
        for thread in starting:
            thread.start()
        for thread in starting:
            thread.join()
        down = [replica.index for replica in self.remote if not replica.up]
        if down:
            self.stop()
            raise RuntimeError(f"replicas {down} did not start (see the log)")

    @property
    def count(self) -> int:
        return len(self.remote) + 1

    def live(self) -> set[int]:
        return {0} | {replica.index for replica in self.remote if replica.up}

    def route(self, requests: Sequence[Request]) -> list[int]:
        return self.router.route([document_key(r) for r in requests], [len(r) for r in requests], self.live())

    def resident_lengths(self, keys: Sequence[bytes], prompts: Sequence[np.ndarray],
                         here: Callable[[np.ndarray], int]) -> list[int]:
        """How long a prefix of each prompt (a document prefix, of key `keys[i]`) is resident on the replica its
        document was routed to: `here` for replica 0's and for documents not routed yet, the others asked (0
        for a replica that is down or does not answer within RESIDENT_S)."""
        placed = self.router.placed
        away: dict[int, list[int]] = {}
        out = []
        for i, (key, prompt) in enumerate(zip(keys, prompts)):
            replica = placed.get(key, 0)
            out.append(here(prompt) if replica == 0 else 0)
            if replica:
                away.setdefault(replica, []).append(i)
        asked = [(members, self.remote[r - 1].resident([prompts[i] for i in members])) for r, members in away.items()]
        for members, future in asked:
            for i, length in zip(members, _answer(future) or ()):  # down or slow: nothing counted resident there
                out[i] = length
        return out

    def launch(self, requests: Sequence[Request], work: QueryWork,
               scoring: Callable[[Sequence[Request], QueryWork], Answers],
               decoding: "Decoding | None" = None
               ) -> RoutedScoring:
        """The requests' answers: each routed (`route`), replica 0's computed here by `scoring` (queued on the
        device now), the others' sent to their replicas: log-probabilities, or with `decoding` the tokens it
        gives after each (`scoring` decodes them here)."""
        groups: dict[int, list[int]] = {}
        for i, replica in enumerate(self.route(requests)):
            groups.setdefault(replica, []).append(i)
        mine = groups.pop(0, [])
        mine_tokens = sum(len(requests[i]) for i in mine)
        away = []  # sent first: replica 0's passes are queued on this thread (on the CPU, computed)
        for r, members in groups.items():
            future = self.remote[r - 1].submit([requests[i] for i in members], decoding)
            tokens = sum(len(requests[i]) for i in members)
            future.add_done_callback(lambda _, r=r, tokens=tokens: self.router.done(r, tokens))
            away.append((self.remote[r - 1], members, future))
        if not mine:
            work.under_way.set()  # nothing for this host's device: its passes are the replicas'
        fresh = work.stats.fresh_tokens
        try:
            here = scoring([requests[i] for i in mine], work) if mine else None
        except BaseException:  # cancelled, say: the others' jobs end too
            self.router.done(0, mine_tokens)
            for replica, _, future in away:
                replica.cancel(future)
            raise
        with self._lock:
            self.here = self.here.plus(Stats(requests=len(mine), logical_tokens=mine_tokens,
                                             fresh_tokens=work.stats.fresh_tokens - fresh))
        return RoutedScoring(len(requests), (mine, here), away, requests, work, scoring, self._rerun,
                             lambda: self.router.done(0, mine_tokens))

    def _rerun(self, requests: int) -> None:
        with self._lock:
            self.rerun += requests

    def forget(self, rejected: Sequence[Request], accepted: Sequence[Request]) -> None:
        """Runtime.forget on the other replicas, each for the documents the router placed there."""
        placed = self.router.placed
        for replica in self.remote:
            mine = [r for r in rejected if placed.get(document_key(r)) == replica.index]
            if mine:
                replica.forget(mine, [r for r in accepted if placed.get(document_key(r)) == replica.index])

    def stats(self, replica: int) -> Stats:
        """What the requests routed to the replica cost there, summed."""
        return self.here if replica == 0 else self.remote[replica - 1].computed

    def busy_seconds(self, here: float) -> list[float | None]:
        """Each replica's device busy seconds so far: `here` for replica 0, the others asked (None for one that
        is down or does not answer within RESIDENT_S)."""
        asked = [replica.busy() for replica in self.remote]
        return [here, *map(_answer, asked)]

    def stop(self) -> None:
        for replica in self.remote:
            replica.stop()
        self._disconnect()


def _answer(future: Future):
    """The answer of a question asked of a replica (its cost left out), None when the replica is down or does not
    answer within RESIDENT_S."""
    try:
        return future.result(RESIDENT_S)[0]
    except Exception:  # noqa: BLE001 — down or slow: no answer this time
        return None


def _start(replica: Replica) -> None:
    try:
        replica.start()
    except Exception:  # noqa: BLE001 — Replicas reports the replicas left down
        log.exception("replica %d did not start", replica.index)


@dataclass
class RoutedScoring:
    """Answers of requests spread over the replicas.

    (Replicas.launch; log-probabilities or continuations):
    replica 0's being computed here, the others' as futures. `read` waits for all (checking the query's
    cancellation, which stops the other replicas' jobs too), runs here the requests of a replica that ended
    (`rerun` counts them), and adds what the others computed to the query's counters."""

    size: int
    here: tuple[list[int], Answers | None]
    away: list[tuple[Replica, list[int], Future]]
    requests: Sequence[Request]
    work: QueryWork
    scoring: Callable[[Sequence[Request], QueryWork], Answers]
    rerun: Callable[[int], None]
    read_here: Callable[[], None]  # replica 0's answers have been read

    def read(self) -> list:
        out: list = [np.empty(0)] * self.size
        members, scoring = self.here
        try:
            if scoring is not None:
                self._place(out, members, scoring.read())
        finally:
            self.read_here()
        for replica, members, future in self.away:
            try:
                self._place(out, members, self._wait(replica, future))
            except ReplicaLost:
                self.rerun(len(members))
                self._place(out, members, self.scoring([self.requests[i] for i in members], self.work).read())
        return out

    @staticmethod
    def _place(out: list, members: list[int], answers: list) -> None:
        for i, row in zip(members, answers):
            out[i] = row

    def _wait(self, replica: Replica, future: Future) -> list:
        while True:
            try:
                self.work.check()
            except QuailError:
                replica.cancel(future)
                raise
            try:
                answers, stats = future.result(POLL_S)
            except FutureTimeout:
                continue
            self.work.stats = self.work.stats.plus(replace(stats, requests=0, logical_tokens=0))
            return answers
