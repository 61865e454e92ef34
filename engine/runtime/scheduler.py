"""The scheduler: which queries' rows share each forward pass, and when the next pass is filled.

- Which queries' rows share a pass (`PassScheduler`, the device's owner loop): every running query's
  model work waits in one place and each pass is packed from many queries' rows: the SHARING_QUERIES
  that came first up to an equal share of the budget each, then every query in arrival order takes
  what is left; short and decoding queries first, a scan moving at least every other pass (`_share_out`).
- When the next pass is filled (`Pacing`): while the device runs the last layers of the one before, so a
  query arriving during a pass joins the next; a short statement or a decode step arriving while the loop
  queues a pass cuts into it at a point the runner offers between two layers (`ModelRunner.passing`), the
  host queuing at most a few layers ahead of the device (`layers_ahead`) until the pass's mark, and through
  a long pass's every layer, the last of the pass before it counted (`_CutIn`). The rule of the lead is
  pacing.py's.
- It drives the model runner it is given (`Runner`); the runner knows nothing of it.
- How long a pass may be while short or decoding jobs wait (`pass_tokens`, DECODE_PASS_TOKENS).
- Beside it: what fits a pass (packing.py), the quail strategy's order of a step's requests
  (tree_job.py), how a step is cut into parts (step_parts.py), the executor's row counts (estimates.py).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ContextManager, Generator, Protocol, Sequence

from quail.engine.runtime.counters import Stats
from quail.engine.runtime.device_time import DeviceTime
from quail.engine.runtime.packing import Fill, Row, Share
from quail.engine.runtime.pacing import Pacing
from quail.engine.runtime.pass_events import PassEvents

if TYPE_CHECKING:
    import torch

    from quail.engine.kv.runs import KV

Aside = Callable[[], ContextManager[None]]
Result = "tuple[torch.Tensor, list[KV | None]]"


class Runner(Protocol):
    """What the scheduler asks of a model runner (model_runner.ModelRunner does it).

    - `token_budget`, `layers`, `padded`: a pass's default budget, the model's layers, whether attention pads;
      `layer_weights`: a layer's weights (what a token costs the device there).
    - `check()` raises to stop a query before its next pass; `opened()`: a pass holding its rows is under way.
    - `passing` queues a pass a layer at a time, yielding (layer, aside) between layers; `forward_shared`
      queues it whole.
    """

    token_budget: int
    layers: int
    layer_weights: int
    padded: bool
    check: Callable[[], None]
    opened: Callable[[], None]

    def pass_events(self, mark: int) -> PassEvents | None: ...

    def passing(self, groups: Sequence[tuple[list[Row], Stats]], events: PassEvents | None,
                opened: Callable[[], None]) -> Generator[tuple[int, Aside], None, Result]: ...

    def forward_shared(self, groups: Sequence[tuple[list[Row], Stats]], events: PassEvents | None,
                       opened: Callable[[], None]) -> Result: ...


DECODE_PASS_TOKENS = 2048  # a pass's budget while a query decodes: its next token waits for the whole pass
SHORT_PASS_TOKENS = 2048  # a pass's budget while a short job (at most that many tokens) waits beside others
SHORT_WINDOW_S = 1.0  # and for this long after a job that bounds its passes arrived: the next may come soon


def pass_tokens(tokens: int) -> int | None:
    """The longest pass a job of `tokens` fresh tokens should ride: SHORT_PASS_TOKENS for a
    short one (an interactive statement's, which would otherwise wait for whole passes of a scan beside
    it), else None.

    >>> pass_tokens(1500), pass_tokens(50_000)
    (2048, None)
    """
    return SHORT_PASS_TOKENS if tokens <= SHORT_PASS_TOKENS else None


SHARING_QUERIES = 4  # queries whose jobs share a pass equally; later ones take what they leave, in arrival order


def _share_out(fill: Fill, live: list[_Waiting], others_first: bool = False) -> bool:
    """Fill a pass from the queries' jobs, in their order: the bounded jobs (short or decoding: each waits
    for whole passes) before the others, unless `others_first` (then all alike). Within each group its
    first SHARING_QUERIES queries take up to an equal share of what is left each, then every job in
    order takes what it can: queries finish in about the order they came instead of all at the end of
    the burst (their clients' next statements come spread out, while the device has work), and a scan is
    not held back by more than a few older ones. A query's share is its jobs' together, taken in the
    order they came (a step's later part takes what the part before it leaves). Whether the others
    (there being some, beside bounded jobs) got nothing: then they should not wait behind bounded jobs in
    the next pass."""
    taken = [0] * len(live)
    by_query: dict[int, int] = {}  # each query's tokens in the pass
    bounded = [k for k, waiting in enumerate(live) if waiting.job.pass_tokens is not None]
    others = [k for k in range(len(live)) if k not in bounded]
    for group in [range(len(live))] if others_first else (bounded, others):
        first = _first_queries(live, group)
        queries = len({id(live[k].job.stats) for k in first})
        for members, limit in ((first, (fill.budget - fill.tokens) // max(1, queries)), (group, None)):
            for k in members:
                query = id(live[k].job.stats)
                share = Share(fill, limit, by_query.get(query, 0))
                live[k].job.fill(share)
                taken[k] += share.tokens - by_query.get(query, 0)
                by_query[query] = share.tokens
    return bool(bounded and others) and not any(taken[k] for k in others)


def _first_queries(live: list[_Waiting], group: Sequence[int]) -> list[int]:
    """The jobs in `group` of its first SHARING_QUERIES queries (a query's jobs share its counters)."""
    queries: list[int] = []
    for k in group:
        if id(live[k].job.stats) not in queries and len(queries) < SHARING_QUERIES:
            queries.append(id(live[k].job.stats))
    return [k for k in group if id(live[k].job.stats) in queries]


def new_pass(runner: Runner) -> Fill:
    """An empty forward pass of the runner's budget and attention layout."""
    return Fill(runner.token_budget, padded=runner.padded)


class Job(Protocol):
    """A query's model work as the scheduler drives it, a pass at a time.

    Rows for a pass, then their
    results. `runner` is the query's (its budget, check, pool and tree), `stats` its counters;
    `pass_tokens`: the longest pass it should ride while it waits, None: any (its rows are
    decode steps, each waiting for the pass before it: DECODE_PASS_TOKENS; it is short: `pass_tokens`)."""

    runner: Runner
    stats: Stats
    pass_tokens: int | None

    def done(self) -> bool: ...

    def fill(self, fill: Share) -> None: ...

    def rows(self, base: int) -> list[Row]: ...

    def take(self, last: torch.Tensor, kept: list[KV | None]) -> None: ...


@dataclass(eq=False)
class _Waiting:
    """A job in the scheduler, and how its query thread learns that it ended."""

    job: Job
    ended: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


AHEAD_LAYERS = 6  # layers of a pass the host queues ahead of the device (CUDA), up to the pass's mark (Pacing)
AHEAD_WORK = 1.6e12  # a long pass's weights times tokens queued ahead: a layer of Qwen3-4B over 16,384 tokens, ~5 ms


def layers_ahead(tokens: int, layer_weights: int) -> int:
    """How many layers of a pass of `tokens` the host queues ahead of the device while work may cut in.

    - A short pass (at most SHORT_PASS_TOKENS): AHEAD_LAYERS, up to its mark (`_CutIn`).
    - A long one: as many as hold about AHEAD_WORK of the device's work (a layer's weights times the
      pass's tokens), at least one and at most AHEAD_LAYERS: what cuts in waits about as long whatever
      the pass's size and the model's.

    >>> four_b, six_tenths_b = 100_925_440, 15_728_640  # Qwen3-4B's and Qwen3-0.6B's weights a layer
    >>> [layers_ahead(tokens, four_b) for tokens in (2048, 4096, 8192, 16384)], layers_ahead(16384, six_tenths_b)
    ([6, 4, 2, 1], 6)
    """
    if tokens <= SHORT_PASS_TOKENS:
        return AHEAD_LAYERS
    return min(AHEAD_LAYERS, max(1, math.ceil(AHEAD_WORK / (layer_weights * tokens))))


class _CutIn:
    """Bounded jobs (short statements, decode steps) that came while the owner loop queues a pass, in a pass
    of their own between two of its layers, as long as the passes cut in hold fewer tokens than the pass
    around them (`tokens`): it keeps at least about half of the device. While one may still cut in, the
    host queues the pass's layers at most a few ahead of the device (`ahead`), so what cuts in waits for
    about that many layers, not for a pass:

    - a pass of at most SHORT_PASS_TOKENS: its layers before its mark, AHEAD_LAYERS ahead (from the mark
      on, the host queues the rest and fills the next pass while the device runs them: `Pacing`);
    - a longer one (`before`: the pass queued before it): every layer, its first ones counted after the
      last of the pass before, `layers_ahead` of them (one of the 4B shape's passes of 16,384 tokens): about
      as long a wait whatever the pass's size. A lead grown past them (after passes the host filled late)
      would otherwise leave most of a long pass queued at once, and a statement cutting in behind it waiting
      about that long (bench/GPU_NOTES.md); the host fills the next pass with those layers left to run."""

    def __init__(self, loop: "PassScheduler", queue: list[_Waiting], came: int, tokens: int,
                 events: PassEvents | None, before: PassEvents | None = None) -> None:
        self.loop, self.queue, self.came, self.left, self.events = loop, queue, came, tokens, events
        self.long = tokens > SHORT_PASS_TOKENS
        self.ahead = layers_ahead(tokens, loop.runner.layer_weights)
        self.before = before if before is not None and len(before.layers) > self.ahead else None
        self.seconds = 0.0  # the host's time in the passes cut in (on the CPU, the device's)

    def through(self, passing: Generator[tuple[int, Aside], None, Result]) -> Result:
        """The pass queued to its end, the jobs that came meanwhile cut in between its layers; its result."""
        while True:
            try:
                layer, aside = next(passing)
            except StopIteration as done:
                return done.value
            self.at(layer, aside)

    def at(self, layer: int, aside: Aside) -> None:
        """The host reached `layer` of the pass: it waits for the device to start the layer `ahead` before
        it, then the jobs that came meanwhile cut in (with the pass's buffers set `aside`)."""
        if self.left <= 0:
            return
        events = self.events
        if events is not None:
            events.layer_queued()
            ahead = self.ahead
            if ahead <= layer and (layer < events.mark or self.long):
                events.reach_layer(layer - ahead)
            elif layer < ahead and self.long and self.before is not None:
                self.before.reach_layer(len(self.before.layers) - ahead + layer)
        if self.loop._bounded_came != self.came:
            with aside():
                self.run()

    def run(self) -> None:
        """The pass cut in, its busy time counted apart (and out of the pass around it: `PassEvents.inside`)."""
        loop = self.loop
        self.came = loop._bounded_came
        events = loop.runner.pass_events(loop.pacing.mark)
        began = time.perf_counter()
        tokens = loop._cut_in(self.queue, events)
        if tokens:
            seconds = time.perf_counter() - began
            loop.busy.add(events, seconds)
            self.seconds += seconds
            if self.events is not None:
                self.events.inside.append(events)
        self.left -= tokens


class PassScheduler:
    """The device's owner loop: every query's rows packed into shared forward passes.

    Every running query's model work waits here, and each forward pass is packed from the rows of many
    queries (continuous batching across queries).

    Fairness: the queries with work lead a pass in turn (round robin) and each
    takes up to an equal share of its token budget (the leader's runner's)
    before any takes more; what one leaves unused goes to the others in the
    same order. A query's jobs (a step's parts: the next is queued while the
    one before runs) share its turn and its share, in the order they came, so
    a later part fills what the part before leaves of a pass. A job bounds
    the passes it rides (`pass_tokens`): while a query decodes, passes hold at
    most DECODE_PASS_TOKENS tokens (each of its tokens
    waits for a pass, so a long scan beside it must not make every step a full
    pass long), while a short job waits at most SHORT_PASS_TOKENS. Bounded jobs
    fill a pass before the others, except after a pass in which the others got
    nothing (then all share alike): a short statement fits in the first pass it
    finds, and a scan moves at least every other pass while short work keeps
    coming. A query admitted while others run joins the next pass (the loop
    fills it while the device runs the last layers of the pass before:
    `Pacing`), so it waits for the rest of the pass in flight too; but bounded
    jobs that come while the loop queues a pass's layers cut into it
    (`_CutIn`): at its next layer the loop queues a pass of theirs alone, then
    the rest of the layers, so a short statement waits for the layers already
    queued, not for a pass; as long as the passes cut in hold fewer tokens
    than the pass around them, which keeps about half of the device. On CUDA
    the loop queues a pass's layers before its mark (a long pass's, all of
    them) at most `layers_ahead` ahead of the device meanwhile, so those are
    few. For
    SHORT_WINDOW_S after a job that bounds its passes arrived beside another
    query's, every pass holds at most SHORT_PASS_TOKENS, so the next short
    statement of a burst (a dashboard's) finds a short pass in flight. Before
    each pass each query's check runs: a query cancelled or past its deadline
    leaves at once, its rows with it.
    """

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.pacing = Pacing(runner.layers)
        self.busy = DeviceTime()  # the device's seconds in the passes this loop ran
        self._cond = threading.Condition()
        self._waiting: deque[_Waiting] = deque()
        self._thread: threading.Thread | None = None
        self._short_until = 0.0  # time.monotonic() until which passes stay short
        self._starved = False  # the unbounded jobs got nothing in the last pass: no bounded job leads the next
        self._bounded_came = 0  # bounded jobs that came beside another query's: a pass being queued lets them in
        self._came_before = 0  # how many had come when the loop took the queue of the pass it queues

    def waiting(self) -> int:
        """Queries with model work in the scheduler."""
        with self._cond:
            return len(self._waiting)

    def place(self, stats: Stats) -> int | None:
        """Where the query counting into `stats` stands for the next pass (1: it leads), None: it has no
        model work here."""
        with self._cond:
            return next((k + 1 for k, waiting in enumerate(self._waiting) if waiting.job.stats is stats), None)

    def run(self, job: Job) -> None:
        """Drive the job until its last pass is queued on the device (called from its query's thread);
        raises what its check (or its pass) raised."""
        if job.done():
            return
        waiting = _Waiting(job)
        with self._cond:
            if job.pass_tokens is not None and any(w.job.stats is not job.stats for w in self._waiting):
                self._short_until = time.monotonic() + SHORT_WINDOW_S
                self._bounded_came += 1
            self._waiting.append(waiting)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="quail-scheduler", daemon=True)
                self._thread.start()
            self._cond.notify()
        waiting.ended.wait()
        # The error's traceback holds the scheduler's frames and this one: kept by the waiting or by this
        # frame, it would make a cycle that keeps the job (its KV in the pool) until a garbage collection.
        error, waiting.error = waiting.error, None
        if error is not None:
            try:
                raise error
            finally:
                error = None

    def _loop(self) -> None:
        while True:
            self.pacing.wait()
            self._guarded(self._queue(), self._pass)  # no reference to a query's work outlives its pass here

    def _guarded(self, queue: list[_Waiting], one_pass: Callable[[list[_Waiting]], int]) -> int:
        """One pass, and the tokens it ran; an error outside any one query's part (filling the pass, say)
        ends every query in it, so none is left waiting on a loop that stopped."""
        try:
            return one_pass(queue)
        except BaseException as err:
            for waiting in queue:
                if not waiting.ended.is_set():
                    self._end(waiting, err)
            return 0

    def _queue(self) -> list[_Waiting]:
        with self._cond:
            while not self._waiting:
                self.pacing.idle = True
                self._cond.wait()
            self._came_before = self._bounded_came
            return list(self._waiting)

    def _pass(self, queue: list[_Waiting]) -> int:
        """One forward pass over the rows of the queries in `queue` (in their order) that may go on, and its
        tokens; bounded jobs that come while the host queues it may cut into it (`_CutIn`)."""
        filled = self._fill(queue, self._starved)
        if filled is None:
            self.pacing.idle = True
            return 0
        live, groups, self._starved = filled
        tokens = _tokens(groups)
        if not tokens:  # every query waits for another's documents: for it to come
            self.pacing.idle = True
            with self._cond:
                self._cond.wait(0.01)
            return 0
        events = self.runner.pass_events(self.pacing.mark)
        began = time.perf_counter()
        cut_in = _CutIn(self, queue, self._came_before, tokens, events, self.pacing.last)
        result = self._forward(live, groups, events, cut_in)
        if result is None:
            self.pacing.idle = True
            return 0
        self.busy.add(events, time.perf_counter() - began - cut_in.seconds)
        self.pacing.queued(events)
        self._take(live, groups, result)
        with self._cond:
            if self._waiting and self._waiting[0] is live[0]:  # the next query leads; this one's jobs in order
                leader = [waiting for waiting in self._waiting if waiting.job.stats is live[0].job.stats]
                for waiting in leader:
                    self._waiting.remove(waiting)
                self._waiting.extend(leader)
        return tokens

    def _cut_in(self, queue: list[_Waiting], events: PassEvents | None) -> int:
        """A pass inside the one being queued (`queue`), of the bounded jobs waiting of queries with no job
        in it, recording `events`; the tokens it ran (0: none, or it failed). It moves no turn."""
        with self._cond:
            present = {id(waiting.job.stats) for waiting in queue}
            jobs = [waiting for waiting in self._waiting
                    if waiting.job.pass_tokens is not None and id(waiting.job.stats) not in present]
        return self._guarded(jobs, lambda jobs: self._inner_pass(jobs, events)) if jobs else 0

    def _inner_pass(self, jobs: list[_Waiting], events: PassEvents | None) -> int:
        filled = self._fill(jobs, False)
        if filled is None:
            return 0
        live, groups, _ = filled
        tokens = _tokens(groups)
        result = self._forward(live, groups, events, None) if tokens else None
        if result is None:
            return 0
        self._take(live, groups, result)
        return tokens

    def _fill(self, queue: list[_Waiting], starved: bool
              ) -> tuple[list[_Waiting], list[tuple[list[Row], Stats]], bool] | None:
        """The queries of `queue` that may go on, each one's rows of the next pass, and whether the unbounded
        jobs got nothing (`_share_out`); None when none may go on (a query cancelled or past its deadline
        leaves at once, with its own error)."""
        live = []
        for waiting in queue:
            try:
                waiting.job.runner.check()
                live.append(waiting)
            except BaseException as err:  # the query's own error (cancelled, past its deadline) goes to it
                self._end(waiting, err)
        if not live:
            return None
        fill = new_pass(live[0].job.runner)
        fill.budget = self._budget(live, fill.budget)
        starved = _share_out(fill, live, starved)
        groups, base = [], 0
        for waiting in live:
            rows = waiting.job.rows(base)
            groups.append((rows, waiting.job.stats))
            base += len(rows)
        return live, groups, starved

    def _forward(self, live: list[_Waiting], groups: list[tuple[list[Row], Stats]], events: PassEvents | None,
                 cut_in: _CutIn | None) -> tuple[torch.Tensor, list[KV | None]] | None:
        """The pass queued on the device; None when it failed (every query in it gets the error)."""
        present = [waiting.job.runner for waiting, (rows, _) in zip(live, groups) if rows]

        def opened() -> None:
            for runner in present:
                runner.opened()
        try:
            if cut_in is None:
                return self.runner.forward_shared(groups, events, opened)
            return cut_in.through(self.runner.passing(groups, events, opened))
        except BaseException as err:
            for waiting in live:
                self._end(waiting, err)
            return None

    def _take(self, live: list[_Waiting], groups: list[tuple[list[Row], Stats]],
              result: tuple[torch.Tensor, list[KV | None]]) -> None:
        """Each job's part of the pass's results; a job done (or failed taking them) ends once the pass's rows
        and kept KV are let go (`groups` and the result's list emptied): what a finished query held is freed
        by the time it learns it is done."""
        ended = self._taken(live, groups, result)
        result[1].clear()
        groups.clear()
        for waiting, error in ended:
            self._end(waiting, error)

    def _taken(self, live: list[_Waiting], groups: list[tuple[list[Row], Stats]],
               result: tuple[torch.Tensor, list[KV | None]]) -> list[tuple[_Waiting, BaseException | None]]:
        """Each job's part of the pass's results given to it; the jobs done, and those that failed taking them
        with their errors."""
        last, kept = result
        start, ended = 0, []
        for waiting, (rows, _) in zip(live, groups):
            try:
                waiting.job.take(last[start:start + len(rows)], kept[start:start + len(rows)])
            except BaseException as err:
                ended.append((waiting, err))
                continue
            finally:
                start += len(rows)
            if waiting.job.done():
                ended.append((waiting, None))
        return ended

    def _budget(self, live: list[_Waiting], budget: int) -> int:
        """A pass's token budget: the leader's, bounded by each job's own bound, and by SHORT_PASS_TOKENS
        within SHORT_WINDOW_S of a bounded job's arrival beside another query's."""
        bounds = [waiting.job.pass_tokens for waiting in live if waiting.job.pass_tokens is not None]
        if time.monotonic() < self._short_until:
            bounds.append(SHORT_PASS_TOKENS)
        return min([budget, *bounds])

    def _end(self, waiting: _Waiting, error: BaseException | None) -> None:
        with self._cond:
            if waiting in self._waiting:
                self._waiting.remove(waiting)
        waiting.error = error
        waiting.ended.set()


def _tokens(groups: list[tuple[list[Row], Stats]]) -> int:
    """A pass's tokens."""
    return sum(len(row.ids) for rows, _ in groups for row in rows)
