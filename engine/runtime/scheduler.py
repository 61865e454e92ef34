"""The scheduler: every decision of what runs in which forward pass, and when.

- Which queries' rows share a pass (`PassScheduler`, the device's owner loop): every running query's
  model work waits in one place and each pass is packed from many queries' rows: the SHARING_QUERIES
  that came first up to an equal share of the budget each, then every query in arrival order takes
  what is left; short and decoding queries first, a scan moving at least every other pass (`_share_out`).
- When the next pass is filled (`Pacing`): while the device runs the last layers of the one before, so a
  query arriving during a pass joins the next; a short statement or a decode step arriving while the loop
  queues a pass cuts into it between two layers, the host queuing at most AHEAD_LAYERS ahead of the device
  until the pass's mark (`_CutIn`).
- What fits a pass: a token budget, and padded attention's area at most PAD_FACTOR times it (Fill, pack).
- In what order a step's requests are computed (`tree`, the quail strategy): each shared prefix once,
  longest roots first, depth first, short prefixes joined by their children in one pass, prompts longer
  than a pass in chunks, each request after the resident prefix it continues (`_continued`: whole
  segments, or a long shared run), a document another running query is computing waited for, not
  computed twice (`_Hold`).
- How a step is cut into parts handed to the runtime (`step_parts`): rows ordered by their anchor's text,
  a head of about HEAD_PASSES passes (the device starts early), then the rest.
- How many rows the executor sends at a time: PROBE_ROWS (an AI filter chain's probe), CHUNK_ROWS
  (a streamed plan's chunks).
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ContextManager, Protocol, Sequence

import numpy as np

from quail.engine.kernels.padding_buckets import padded_shape, width_class
from quail.engine.kv.token_prefix import common_start
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.device_time import DeviceTime
from quail.engine.runtime.radix import RadixNode, build, collapse, nodes
from quail.engine.runtime.requests import Request, document_prefix

if TYPE_CHECKING:
    import torch

    from quail.engine.kv.leaves import Node
    from quail.engine.kv.resident import Match, ResidentTree
    from quail.engine.kv.runs import KV
    from quail.engine.runtime.model_runner import ModelRunner, PassEvents

Strategy = Callable[["ModelRunner", Sequence[Request], Stats], "list[torch.Tensor]"]

PROBE_ROWS = 64
CHARS_PER_TOKEN = 4.0  # for estimates only: English text in a BPE vocabulary
CHUNK_ROWS = (64, 8192)  # a chunked plan's first and largest chunks: the first rows leave after a pass or two


@dataclass
class Row:
    """New tokens of a pass, and what they continue.

    New tokens to compute after `past` (None: from position 0) and, where `parent` names one, after
    that earlier row of the same pass (whose past is this row's too); the KV of the first `keep` of them
    is returned (written into the pool). Or, with `slots` (and no past), after the tokens whose KV those
    slots of the runner's pool hold, in order: a decode step, which the runner runs as one when every
    row of the pass is one. With `fed` (tensor, index), the row's one token is that element of a tensor
    on the device (a token chosen after an earlier pass, not yet read by the host); `ids` holds a
    placeholder."""

    ids: np.ndarray
    past: KV | None = None
    keep: int = 0
    parent: int | None = None
    slots: np.ndarray | None = None
    fed: tuple[torch.Tensor, int] | None = None


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

PAD_FACTOR = 2  # attention pads each row to its bucket's longest: padded area ≤ PAD_FACTOR × budget


@dataclass
class Fill:
    """A forward pass being filled.

    New tokens, and each padding bucket's rows and longest row (padded:
    attention pads rows per bucket, so the padded area is bounded too)."""

    budget: int
    tokens: int = 0
    buckets: dict[int, tuple[int, int]] = field(default_factory=dict)
    padded: bool = True

    def _area(self, length: int) -> int:
        """The padded attention area with one more row of `length` tokens."""
        key = width_class(length)
        rows, width = self.buckets.get(key, (0, 0))
        others = sum(math.prod(padded_shape(r, w)) for k, (r, w) in self.buckets.items() if k != key)
        return others + math.prod(padded_shape(rows + 1, max(width, length)))

    def admits(self, length: int) -> bool:
        """Whether a row of `length` new tokens still fits (an empty pass takes any row)."""
        if not self.buckets:
            return True
        fits = self.tokens + length <= self.budget
        return fits and (not self.padded or self._area(length) <= PAD_FACTOR * self.budget)

    def add(self, length: int) -> None:
        key = width_class(length)
        rows, width = self.buckets.get(key, (0, 0))
        self.buckets[key] = (rows + 1, max(width, length))
        self.tokens += length


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


def new_pass(runner: ModelRunner) -> Fill:
    """An empty forward pass of the runner's budget and attention layout."""
    return Fill(runner.token_budget, padded=runner.model.padded_attention)


@dataclass
class Share:
    """A pass as one query fills it.

    What the pass admits, and this query's `tokens` in it, at most `limit`
    (None: no bound of its own). A query adds rows while its share admits them."""

    fill: Fill
    limit: int | None
    tokens: int = 0

    def admits(self, length: int) -> bool:
        return (self.limit is None or self.tokens < self.limit) and self.fill.admits(length)

    def add(self, length: int) -> None:
        self.fill.add(length)
        self.tokens += length


class Job(Protocol):
    """A query's model work as the scheduler drives it, a pass at a time.

    Rows for a pass, then their
    results. `runner` is the query's (its budget, check, pool and tree), `stats` its counters;
    `pass_tokens`: the longest pass it should ride while it waits, None: any (its rows are
    decode steps, each waiting for the pass before it: DECODE_PASS_TOKENS; it is short: `pass_tokens`)."""

    runner: ModelRunner
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


GAP_MS = 1.0  # the device idle longer than this between two passes: the host filled the second too late
QUIET = 8  # passes in a row without such a gap before the lead shrinks by a layer


class Pacing:
    """When the owner loop fills the next pass, where the device runs queued passes behind the host (CUDA).

    The loop fills a pass once the device has started layer `layers - lead` of
    the pass queued before it, so it fills while the device runs those last
    `lead` layers: a query that arrives while a pass computes joins the next
    pass, not the one after (filled at once, the next pass would be fixed
    before the query came). `lead` adapts to the host's speed: it grows by
    half when the device waited for the host between two passes (a gap over
    GAP_MS), and shrinks by one after QUIET passes in a row without a gap.
    Passes after the loop waited for work are not judged. On the CPU a pass
    runs on the loop's own thread: no events, nothing to wait for.
    """

    def __init__(self, layers: int) -> None:
        self.layers = layers
        self.lead = max(1, layers // 4)
        self.quiet = 0
        self.idle = True  # the loop waited for work (or ran no pass) since the pass queued last
        self.last: PassEvents | None = None
        self.judged: tuple[PassEvents, PassEvents] | None = None  # (a pass, the next), when the next came at once

    @property
    def mark(self) -> int:
        """The layer of the next pass whose start lets the loop fill the one after it."""
        return self.layers - self.lead

    def queued(self, events: PassEvents | None) -> None:
        """A pass recording `events` went to the device."""
        if events is None:
            return
        self.judged = None if self.idle or self.last is None else (self.last, events)
        self.last, self.idle = events, False

    def wait(self) -> None:
        """Until the device starts the mark of the pass queued last; then the gap before that pass is judged."""
        if self.last is None:
            return
        self.last.reach_mark()
        if self.judged is not None:
            before, after = self.judged
            self.observe(before.end.elapsed_time(after.start))
            self.judged = None

    def observe(self, gap_ms: float) -> None:
        """The device's idle time between two passes the loop queued one after the other.

        >>> pacing = Pacing(36)
        >>> pacing.observe(5.0); pacing.lead
        13
        >>> for _ in range(QUIET): pacing.observe(0.0)
        >>> pacing.lead
        12
        """
        if gap_ms > GAP_MS:
            self.lead, self.quiet = min(self.layers, self.lead + max(1, self.lead // 2)), 0
            return
        self.quiet += 1
        if self.quiet >= QUIET:
            self.lead, self.quiet = max(1, self.lead - 1), 0


AHEAD_LAYERS = 6  # layers of a pass the host queues ahead of the device (CUDA), up to the pass's mark (Pacing)


class _CutIn:
    """Bounded jobs (short statements, decode steps) that came while the owner loop queues a pass, in a pass
    of their own between two of its layers, as long as the passes cut in hold fewer tokens than the pass
    around them (`tokens`): it keeps at least about half of the device. While one may still cut in, the
    host queues the pass's layers before its mark at most AHEAD_LAYERS ahead of the device, so what cuts in
    waits for about that many layers, not for the pass (from the mark on, the host queues the rest and
    fills the next pass while the device runs them: `Pacing`)."""

    def __init__(self, loop: "PassScheduler", queue: list[_Waiting], came: int, tokens: int,
                 events: PassEvents | None) -> None:
        self.loop, self.queue, self.came, self.left, self.events = loop, queue, came, tokens, events
        self.seconds = 0.0  # the host's time in the passes cut in (on the CPU, the device's)

    def at(self, layer: int, aside: Callable[[], ContextManager[None]]) -> None:
        """The host reached `layer` of the pass: it waits for the device to start the layer AHEAD_LAYERS
        before it, then the jobs that came meanwhile cut in (with the pass's buffers set `aside`)."""
        if self.left <= 0:
            return
        events = self.events
        if events is not None and AHEAD_LAYERS <= layer < events.mark:
            events.reach_layer(layer - AHEAD_LAYERS)
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

    The device's owner loop: every running query's model work waits here, and each forward pass is
    packed from the rows of many queries (continuous batching across queries).

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
    the loop queues a pass's layers before its mark at most AHEAD_LAYERS ahead
    of the device meanwhile, so those are few. For
    SHORT_WINDOW_S after a job that bounds its passes arrived beside another
    query's, every pass holds at most SHORT_PASS_TOKENS, so the next short
    statement of a burst (a dashboard's) finds a short pass in flight. Before
    each pass each query's check runs: a query cancelled or past its deadline
    leaves at once, its rows with it.
    """

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.pacing = Pacing(runner.model.config.num_layers)
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
        cut_in = _CutIn(self, queue, self._came_before, tokens, events)
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
            return self.runner.forward_shared(groups, events, opened, cut_in)
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


def pack(lengths: Sequence[int], budget: int, padded: bool = True) -> list[list[int]]:
    """Consecutive index runs that fit the budget (one row at least).

    The linear layers see packed tokens only; padded attention pads each row to
    the longest of its bucket, a waste `Fill` bounds.
    """
    batches: list[list[int]] = []
    fill = Fill(budget, padded=padded)
    for i, length in enumerate(lengths):
        if not batches or not fill.admits(length):
            batches.append([])
            fill = Fill(budget, padded=padded)
        batches[-1].append(i)
        fill.add(length)
    return batches


def step_parts(texts: Sequence[tuple[str, ...]], token_budget: int) -> tuple[list[int], list[range]]:
    """The order in which a step's rows (each given by its prompt's texts, its anchor's first) go to the
    runtime, and the parts of that order: sorted by text, so rows that share a prefix share a part, then
    cut by `_parts` (a pass holding about `token_budget` × CHARS_PER_TOKEN characters)."""
    order = sorted(range(len(texts)), key=texts.__getitem__)
    shared = [0] + [common_start(texts[a][0], texts[b][0]) for a, b in zip(order, order[1:])]
    fresh = [ROW_CHARS + sum(map(len, texts[r])) - common for r, common in zip(order, shared)]
    return order, _parts(fresh, shared, token_budget * CHARS_PER_TOKEN)


HEAD_PASSES = 4  # a large step's first part, in forward passes of estimated fresh tokens
ROW_CHARS = 32  # a row's fresh characters besides its arguments' (the answer cue; a filter's question)


def _parts(fresh: Sequence[float], shared: Sequence[int], per_pass: float) -> list[range]:
    """The rows (their fresh characters given, `per_pass` to a forward pass) in one part, or, when they
    fill more than 3 × HEAD_PASSES passes, in two: a head of about HEAD_PASSES passes, then the rest. The
    head ends within half its size of that, before the row sharing the fewest characters with the row
    before it (`shared`), nearest the target among those. Each part ends in a pass that is rarely full,
    so a step is cut once: enough to start the device early and tokenize the rest beside it."""
    total = np.cumsum(fresh, dtype=np.float64)
    if not len(total) or total[-1] <= 3 * HEAD_PASSES * per_pass:
        return [range(len(total))] if len(total) else []
    low, target, high = np.searchsorted(total, np.array([0.5, 1.0, 1.5]) * HEAD_PASSES * per_pass) + 1
    cuts = range(max(int(low), 1), min(int(high), len(total) - 1) + 1)
    if not cuts:  # a few rows fill the passes: one part
        return [range(len(total))]
    end = min(cuts, key=lambda e: (shared[e], abs(e - target)))
    return [range(end), range(end, len(total))]


Item = tuple[RadixNode, "KV | Fetch | None", "int | None"]  # a node, the resident KV it continues, its parent's row


def tree(runner: ModelRunner, requests: Sequence[Request], stats: Stats) -> list[torch.Tensor]:
    """Last hidden state per request, each distinct prefix computed once (TreeJob), its passes shared with
    the other queries on the device."""
    job = TreeJob(runner, requests, stats)
    try:
        runner.scheduler.run(job)
    finally:  # done, cancelled or failed: its pins and claims end with it
        job.hold.release()
    return job.hidden


class TreeJob:
    """The quail strategy's work on a set of requests, a pass at a time.

    Passes are filled from the front of a frontier that starts as the roots,
    longest first. A short node's children join its own pass right behind it
    (`_shares`: they attend to its keys there, copied before each of them);
    the children of other nodes, and those that did not fit, go to the front
    once the pass ran, grouped by parent (each parent's KV one run): depth
    first, so a parent's KV is dropped as soon as its last child ran. With the
    runner's resident tree, each request continues the longest prefix of its
    prompt found there (pinned until the first item continuing it joins a pass,
    and taken from the tree then: copied back if it moved to the host tier, at
    most half a pool's worth a pass), and every prompt computed goes into it
    (kv/resident.py). A request whose document another running
    query has claimed waits for that query to compute it, then continues it;
    the job claims the others' documents.
    """

    def __init__(self, runner: ModelRunner, requests: Sequence[Request], stats: Stats) -> None:
        self.runner, self.requests, self.stats = runner, requests, stats
        self.hidden: list[torch.Tensor | None] = [None] * len(requests)
        self.frontier: deque[Item] = deque()
        self.hold = _Hold(runner.tree, requests)
        documents: dict[bytes, Match] = {}
        self.waiting = self.hold.claim(requests, documents)
        planned = self._start([i for i in range(len(requests)) if i not in self.waiting], documents)
        # short, unless it waits for another query's documents: then that query's passes bound its wait
        self.pass_tokens = None if self.waiting else pass_tokens(planned)
        self.items: list[Item] = []  # this pass's, with whether each one's children joined it, and its chain
        self.shared: list[bool] = []
        self.chain: list[int] = []
        self.restored = 0  # tokens this pass's items copied back from the lower tiers

    def _start(self, members: list[int], documents: dict[bytes, Match]) -> int:
        """The members' roots at the frontier's front, longest first; the tokens they plan (counted).
        `documents`: the matches of document prefixes made for them already (`_Hold.claim`; see `_roots`)."""
        roots = _roots(self.runner.tree, self.requests, members, self.hold, documents)
        roots = [(_chunked(node, self.runner.token_budget), kv, None) for node, kv in sorted(
            roots, key=lambda item: len(item[0]), reverse=True)]
        planned = sum(len(node) for root, *_ in roots for node in [root, *nodes(root)])
        self.stats.planned_tokens += planned
        self.frontier.extendleft(reversed(roots))
        return planned

    def done(self) -> bool:
        return not self.frontier and not self.items and not self.waiting

    def fill(self, fill: Share) -> None:
        """Items for the pass from the frontier's front while its share admits them; a node whose children
        join it pushes them to the front (parent: its index among this job's items). First, the requests
        waiting for another query's documents that it has computed (or given up) start."""
        if self.waiting:
            ready = [i for i, key in self.waiting.items() if not self.hold.waits_for(key)]
            for i in ready:
                del self.waiting[i]
            if ready:
                self._start(ready, {})
        while self.frontier and fill.admits(len(self.frontier[0][0])):
            if self.restored > self.runner.pool.slots // 2 and isinstance(self.frontier[0][1], Fetch) and \
                    self.frontier[0][1].kv is None:
                break  # the pass has copied back half a pool from the host tier: the rest waits for the next
            node, kv, parent = self.frontier.popleft()
            if isinstance(kv, Fetch):
                counts = self.runner.tree.counts
                host, disk = counts.restored, counts.from_disk
                kv = kv.run(self.hold)
                self.stats.host_restored_tokens += counts.restored - host
                self.stats.disk_restored_tokens += counts.from_disk - disk
                self.restored += counts.restored - host + counts.from_disk - disk
            fill.add(len(node))
            self.chain.append(0 if parent is None else self.chain[parent] + len(self.items[parent][0]))
            self.items.append((node, kv, parent))
            self.shared.append(bool(node.children) and _shares(self.chain[-1] + len(node), node.children))
            if self.shared[-1]:
                self.frontier.extendleft((child, kv, len(self.items) - 1) for child in sorted(node.children, key=len))

    def rows(self, base: int) -> list[Row]:
        """The items' rows, this job's first at index `base` of the pass: each keeps its KV when children
        continue it or the tree indexes it."""
        keeps = self.runner.tree is not None
        return [Row(self.requests[node.rep].tokens(node.start, node.end), kv,
                    len(node) if keeps or node.children else 0, None if parent is None else base + parent)
                for node, kv, parent in self.items]

    def take(self, last: torch.Tensor, kept: list[KV | None]) -> None:
        """The pass's results for this job's rows: hidden states of the requests that end there, the runs
        the children continue, the prompts indexed in the tree (and the claims on their documents ended)."""
        tree = self.runner.tree
        runs: list[KV | None] = []
        children: list[Item] = []
        for (node, kv, parent), h, new, joined in zip(self.items, last, kept, self.shared):
            for i in node.ends:
                self.hidden[i] = h
            base = runs[parent] if parent is not None else kv
            runs.append(None if new is None or not node.children else new if base is None else base.then(new))
            if tree is not None:
                tree.insert(self.requests[node.rep].tokens(0, node.end), new, node.start, base)
                self.hold.computed(node.rep, node.end)
            if node.children and not joined:
                children.extend((child, runs[-1], None) for child in sorted(node.children, key=len, reverse=True))
        while self.frontier and self.frontier[0][2] is not None:  # children that joined a pass they did not fit in
            node, _, parent = self.frontier.popleft()
            children.append((node, runs[parent], None))
        self.frontier.extendleft(reversed(children))
        self.items, self.shared, self.chain, self.restored = [], [], [], 0
        if self.done():
            self.hold.release()


class _Hold:
    """What a job holds in the resident tree: the nodes it continues (pinned) and the documents it claimed,
    until it is done (`release`, once)."""

    def __init__(self, tree: ResidentTree | None, requests: Sequence[Request]) -> None:
        self.tree = tree
        self.pins: dict[int, Node] = {}  # the node each Fetch (by id) continues, pinned until it has run
        self.claims: dict[bytes, int] = {}  # each claimed document's prefix length
        self.prefixes = [document_prefix(r) for r in requests] if tree is not None else []

    def claim(self, requests: Sequence[Request], documents: dict[bytes, Match]) -> dict[int, bytes]:
        """Claim the documents of the requests that the tree lacks; the requests whose document another
        job claimed, and that document's key (they wait for it). Each document prefix's match goes into
        `documents`, its node pinned (as `_roots` takes them)."""
        waiting: dict[int, bytes] = {}
        if self.tree is None:
            return waiting
        others: set[bytes] = set()  # documents another job claimed
        for i, (request, prefix) in enumerate(zip(requests, self.prefixes)):
            if prefix is None:
                continue
            length, key = prefix
            if key not in documents:
                documents[key] = _document_match(self.tree, request, length)
                if documents[key].length < length:
                    if self.tree.claim(key, self):
                        self.claims[key] = length
                    else:
                        others.add(key)
            if key in others:
                waiting[i] = key
        return waiting

    def waits_for(self, key: bytes) -> bool:
        return self.tree.claimed(key, self)

    def computed(self, request: int, end: int) -> None:
        """The first `end` tokens of request number `request` are in the tree: its document's claim ends if
        they hold it."""
        if self.claims:
            prefix = self.prefixes[request]
            if prefix is not None and self.claims.get(prefix[1], end + 1) <= end:
                del self.claims[prefix[1]]
                self.tree.release([prefix[1]], self)

    def pin(self, node: Node, fetch: Fetch) -> None:
        """Pin the node until `fetch` has run, or the job is done."""
        self.tree.pin(node)
        self.pins[id(fetch)] = node

    def unpin(self, fetch: Fetch) -> None:
        self._unpin(id(fetch))

    def _unpin(self, key: int) -> None:
        node = self.pins.pop(key, None)  # once, whichever thread comes first (dict.pop is atomic)
        if node is not None:
            self.tree.unpin(node)

    def release(self) -> None:
        for key in list(self.pins):
            self._unpin(key)
        if self.claims:
            claims, self.claims = list(self.claims), {}
            self.tree.release(claims, self)


def _chunked(root: RadixNode, budget: int) -> RadixNode:
    """The tree with every edge longer than `budget` cut into a chain of edges of at most `budget` tokens
    (in place): a long prompt is computed in chunks, each continuing the KV of the one before, so no
    forward pass is longer than the budget (its time and memory bounded; cancellation between them)."""
    for node in [root, *nodes(root)]:
        while len(node) > budget:
            tail = RadixNode(node.start + budget, node.end, node.rep, node.children, node.ends)
            node.end, node.children, node.ends = node.start + budget, [tail], []
            node = tail
    return root


def _shares(chain: int, children: list[RadixNode]) -> bool:
    """Whether children attend to a prefix of `chain` tokens computed in their own pass (copied before
    each of them, as a short resident run is: attention.Packed) rather than to its KV in a later pass:
    when the copies are no more than the tokens of the children and of all below them. A preamble
    joins the documents below it; an anchor does not join its partners' short questions."""
    return chain * len(children) <= sum(child.tokens_below() for child in children)


def _roots(tree: ResidentTree | None, requests: Sequence[Request], members: list[int], hold: _Hold,
           documents: dict[bytes, Match]) -> list[tuple[RadixNode, "KV | Fetch | None"]]:
    """The first nodes to compute for these members of `requests`, with the KV they continue: one radix
    tree over those that continue the same resident prefix (or none), cut to what follows it. The tree
    nodes those prefixes end in are pinned (held by `hold`). A request continues at most all but its
    last token (its answer is read there), and as far as `_continued` says. `documents` holds the
    matches of document prefixes made already (`_Hold.claim`), pinned; the others are made here (all
    unpinned at the end)."""
    groups: dict[tuple, list[int]] = {}
    found: dict[tuple, tuple[int, Match | None]] = {}
    matched: dict[int, Match] = {}  # each match once, its node pinned until the groups' own pins hold it
    for i in members:
        request = requests[i]
        match = _match(tree, request, hold.prefixes[i], documents) if tree is not None else None
        if match is not None:
            matched[id(match)] = match
        length, segments = _continued(request, match.length if match is not None else 0)
        key = (length, *(s.key for s in request.segments[:segments])) if segments is not None \
            else (length, id(match.node))
        found.setdefault(key, (length, match))
        groups.setdefault(key, []).append(i)
    out: list[tuple[RadixNode, KV | Fetch | None]] = []
    for key, group in groups.items():
        length, match = found[key]
        kv = None
        if length:
            kv = Fetch(requests[group[0]].tokens(0, length))
            hold.pin(match.node, kv)
        root = collapse(build([requests[i] for i in group]))
        for node in nodes(root):
            node.rep, node.ends = group[node.rep], [group[i] for i in node.ends]
        todo = list(root.children)  # each continues the resident prefix: all its requests share it
        while todo:
            node = todo.pop()
            node.start = max(node.start, length)
            if len(node):
                out.append((node, kv))
            else:
                todo.extend(node.children)
    for match in {**matched, **{id(m): m for m in documents.values()}}.values():
        tree.unpin(match.node)
    return out


def _match(tree: ResidentTree, request: Request, prefix: tuple[int, bytes] | None,
           documents: dict[bytes, Match]) -> Match:
    """The request's longest resident prefix (all but its last token at most). Where the tree lacks part
    of its document prefix (`prefix`), that is the document's match, looked up once for all the requests
    reading the document (a join's partners). Every match made here has its node pinned once (`documents`'
    too: unpin them all)."""
    if prefix is not None:
        length, key = prefix
        if key not in documents:
            documents[key] = _document_match(tree, request, length)
        if documents[key].length < length:
            tree.count(len(request) - 1, documents[key].length)
            return documents[key]
    return tree.match(request.tokens(0, len(request)), len(request) - 1, fetch=False, pin=True, with_kv=False)


def _document_match(tree: ResidentTree, request: Request, length: int) -> Match:
    """The resident part of the request's first `length` tokens (its document prefix), pinned, not counted
    in the hit rate, nothing copied back or held."""
    return tree.match(request.tokens(0, length), counted=False, fetch=False, pin=True, with_kv=False)


@dataclass(eq=False)
class Fetch:
    """A resident prefix a job's requests continue, taken from the tree as late as it can be.

    A resident prefix some of a job's requests continue: its KV is taken from the tree when the first
    item continuing it joins a pass (copied back into the pool if the tree moved it to the host tier), not
    when the job starts, so a job holds no more of the pool than its passes read (its prefixes may be
    more than the pool holds). Its node is pinned until then: it stays in the tree."""

    ids: np.ndarray
    kv: KV | None = None

    def run(self, hold: "_Hold") -> KV:
        if self.kv is None:
            self.kv = hold.tree.match(self.ids, counted=False).kv
            hold.unpin(self)  # the job holds the run itself now
        return self.kv


PARTIAL_TOKENS = 64  # a resident prefix is continued past its last whole segment when it runs this far past it


def _continued(request: Request, length: int) -> tuple[int, int | None]:
    """How much of its resident prefix of `length` tokens a request continues, and in how many whole
    segments (None: part of the last). The prefix ends at a segment boundary (the preamble, a document,
    a question) unless it runs at least PARTIAL_TOKENS into the next segment (a long history shared by
    an agent's traces): a few tokens that the request shares with another's (documents' common first
    words) are computed again rather than continued, so the many requests continuing one segment
    continue one run (read once per pass for all of them, radix.worth_keeping) instead of one run
    each."""
    segments = bisect.bisect_right(request.offsets, length) - 1
    boundary = request.offsets[segments]
    return (length, None) if length - boundary >= PARTIAL_TOKENS else (boundary, segments)
