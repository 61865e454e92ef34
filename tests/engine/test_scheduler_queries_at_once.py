"""Queries at once in the scheduler: cut-ins into a long query's pass, passes shared out, short passes beside a scan."""

from __future__ import annotations

import threading
import time

import numpy as np

from quail.engine.runtime import scheduler
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.packing import Fill, Share
from quail.engine.runtime.query_work import QueryWork
from tests.engine.scheduler_requests import request, scores


def _nested(inside: list, passing, *args):
    """The pass `passing(*args)`, counted in `inside` while it runs: a pass that finds it non-empty runs inside
    another."""
    inside.append(1)
    try:
        return (yield from passing(*args))
    finally:
        inside.pop()


def test_a_short_query_sent_while_a_long_one_s_pass_is_queued_cuts_into_it(runtime, monkeypatch):
    """A long query (many passes) and a short one sent while the long one's first pass is being filled: the
    short one runs in a pass of its own inside that one, between two of its layers, and is done there; the
    long one has rows in every other pass, and both get the answers they get alone."""
    rng = np.random.default_rng(7)
    small = runtime.variant("quail", token_budget=256)
    long = [request(rng.integers(1000, 2000, 100), [7, 9]) for _ in range(12)]  # about five passes alone
    short = [request(rng.integers(2000, 3000, 20), [7, 9]) for _ in range(2)]
    alone = {"long": scores(small, long), "short": scores(small, short)}
    runtime.runner.tree.clear()
    works = {"long": QueryWork(), "short": QueryWork()}
    owners = {id(works[name].stats): name for name in works}
    passes: list[tuple[list[str], int]] = []  # each pass's owners, and how many passes it ran inside
    inside = []
    first_in, release = threading.Event(), threading.Event()
    forward = type(runtime.runner).passing

    def recording(self, groups, *rest):
        passes.append(([owners.get(id(stats), "?") for owned, stats in groups if owned], len(inside)))
        if len(passes) == 1:
            first_in.set()
            release.wait(30)
        return _nested(inside, forward, self, groups, *rest)

    monkeypatch.setattr(type(runtime.runner), "passing", recording)
    got = {}

    def query(name: str, requests) -> None:
        got[name] = np.exp(np.array(small.score(requests, works[name])))

    threads = {"long": threading.Thread(target=query, args=("long", long))}
    threads["long"].start()
    assert first_in.wait(30)
    threads["short"] = threading.Thread(target=query, args=("short", short))
    threads["short"].start()
    while small.scheduler.waiting() < 2:
        threading.Event().wait(0.01)
    release.set()
    for thread in threads.values():
        thread.join(60)
    assert passes[:2] == [(["long"], 0), (["short"], 1)], passes
    assert all(names == ["long"] and depth == 0 for names, depth in passes[2:]), passes
    for name in works:
        np.testing.assert_allclose(got[name], alone[name], atol=1e-4)
        assert works[name].stats.forward_passes == sum(name in names for names, _ in passes)


def test_short_queries_cut_into_a_pass_while_they_hold_fewer_tokens_than_it(runtime, monkeypatch):
    """Short queries sent one after another while a long query's pass is queued, one a layer: each cuts into
    it in a pass of its own, until the passes cut in hold as many tokens as the pass around them; the
    later ones wait for the next pass. Every answer is the one each query gets alone."""
    rng = np.random.default_rng(11)
    small = runtime.variant("quail", token_budget=256)
    long = [request(rng.integers(1000, 2000, 100), [7, 9]) for _ in range(6)]
    shorts = [[request(rng.integers(2000, 3000, 20), [7, 9]) for _ in range(2)] for _ in range(9)]
    alone = [scores(small, requests) for requests in [long, *shorts]]
    runtime.runner.tree.clear()
    works = [QueryWork() for _ in range(10)]
    owners = {id(work.stats): k for k, work in enumerate(works)}
    passes: list[tuple[list[int], int, int]] = []  # each pass's owners, tokens, and how many passes it ran inside
    inside, threads, got = [], [], {}
    model, forward = runtime.runner.model, type(runtime.runner).passing
    finish = type(model).finish

    def query(k: int, requests) -> None:
        got[k] = np.exp(np.array(small.score(requests, works[k])))

    def recording(self, groups, *rest):
        passes.append(([owners[id(stats)] for owned, stats in groups if owned],
                       sum(len(row.ids) for owned, _ in groups for row in owned), len(inside)))
        return _nested(inside, forward, self, groups, *rest)

    def sending(self, layer, *args):
        if len(passes) >= 1 and passes[0][0] == [0] and inside == [1] and len(threads) < len(shorts):
            waiting = small.scheduler.waiting()  # one short query sent a layer, each in the scheduler
            threads.append(threading.Thread(target=query, args=(len(threads) + 1, shorts[len(threads)])))
            threads[-1].start()
            while small.scheduler.waiting() == waiting and threads[-1].is_alive():
                threading.Event().wait(0.005)
        return finish(self, layer, *args)

    monkeypatch.setattr(type(runtime.runner), "passing", recording)
    monkeypatch.setattr(type(model), "finish", sending)
    busy, before, began = small.scheduler.busy, small.scheduler.busy.seconds(), time.perf_counter()
    query(0, long)
    for thread in threads:
        thread.join(60)
    assert 0 < busy.seconds() - before <= time.perf_counter() - began, "the passes cut in count once"
    first, tokens, _ = passes[0]
    cut = [(names, n) for names, n, depth in passes if depth == 1]
    assert first == [0] and cut == [(names, n) for names, n, _ in passes[1:len(cut) + 1]], passes
    assert all(len(names) == 1 for names, _ in cut), "each its own pass, sent a layer apart"
    assert sum(n for _, n in cut[:-1]) < tokens <= sum(n for _, n in cut) and len(cut) < len(shorts), passes
    assert all(depth == 0 for _, _, depth in passes[len(cut) + 1:]), "the rest wait for the next pass"
    for k, want in enumerate(alone):
        np.testing.assert_allclose(got[k], want, atol=1e-4)


def test_queries_at_once_over_the_same_documents_compute_each_document_once(runtime):
    """Four queries sent together, each asking its own question of the same documents (a dashboard's
    tiles): each document is computed by one of them and continued by the others, and every query gets
    the answers it gets alone."""
    rng = np.random.default_rng(11)
    preamble = rng.integers(1000, 2000, 6)
    documents = [rng.integers(2000, 3000, 60) for _ in range(5)]
    asks = [[request(preamble, doc, [7, 10 + q, 9]) for doc in documents] for q in range(4)]
    small = runtime.variant("quail", token_budget=256)
    alone = []
    for step in asks:
        runtime.runner.tree.clear()
        alone.append(scores(small, step))
    runtime.runner.tree.clear()
    works = [QueryWork() for _ in asks]
    got: dict[int, np.ndarray] = {}

    def query(k: int) -> None:
        got[k] = np.exp(np.array(small.score(asks[k], works[k])))

    threads = [threading.Thread(target=query, args=(k,)) for k in range(len(asks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for k in range(len(asks)):
        np.testing.assert_allclose(got[k], alone[k], atol=1e-5)
    fresh = sum(work.stats.fresh_tokens for work in works)
    assert fresh <= len(documents) * (6 + 60 + 3) + 3 * len(documents) * 3, \
        "each document once, then only the other questions"


def _beside_a_scan(runtime, monkeypatch, small, scan, works, second) -> list[tuple[list[str], int, bool]]:
    """Each pass's owners (names of `works`), tokens and whether a job waiting then bounded its passes, while
    `small` runs the scan (as works["scan"]) and, once the scan's first pass is being filled, `second()`:
    that pass waits until both are in the scheduler. It starts with no short window open."""
    small.scheduler._short_until = 0.0  # no window left open by an earlier test's short query
    owners = {id(work.stats): name for name, work in works.items()}
    passes: list[tuple[list[str], int, bool]] = []
    first_in, release = threading.Event(), threading.Event()
    forward = type(runtime.runner).passing

    def recording(self, groups, *rest):
        bounded = any(waiting.job.pass_tokens is not None for waiting in list(small.scheduler._waiting))
        passes.append(([owners.get(id(stats), "?") for owned, stats in groups if owned],
                       sum(len(row.ids) for owned, _ in groups for row in owned), bounded))
        if len(passes) == 1:
            first_in.set()
            release.wait(30)
        return forward(self, groups, *rest)

    monkeypatch.setattr(type(runtime.runner), "passing", recording)
    threads = [threading.Thread(target=small.score, args=(scan, works["scan"])), threading.Thread(target=second)]
    threads[0].start()
    assert first_in.wait(30)
    threads[1].start()
    while small.scheduler.waiting() < 2:
        threading.Event().wait(0.01)
    release.set()
    for thread in threads:
        thread.join(120)
    return passes


def test_passes_stay_short_while_a_query_decodes(runtime, monkeypatch):
    """A scan and a query generating text at once: while the latter decodes, every pass holds at most
    DECODE_PASS_TOKENS tokens (each of its tokens waits for a pass), the scan's rows beside its steps; the
    scan alone fills a pass."""
    from quail.engine.runtime.decode import DecodeJob, Decoding

    monkeypatch.setattr(DecodeJob, "pass_tokens", 128)
    monkeypatch.setattr(scheduler, "SHORT_PASS_TOKENS", 64)  # the scan is not short; the prompts' prefill is
    monkeypatch.setattr(scheduler, "SHORT_WINDOW_S", 0.0)
    rng = np.random.default_rng(8)
    small = runtime.variant("quail", token_budget=256)
    scan = [request(rng.integers(1000, 2000, 100), [7, 9]) for _ in range(12)]
    prompts = [request(rng.integers(2000, 3000, 20), [7, 9]) for _ in range(2)]
    works = {"scan": QueryWork(), "generate": QueryWork()}
    passes = _beside_a_scan(runtime, monkeypatch, small, scan, works,
                            lambda: small.generate(prompts, Decoding(6), works["generate"]))
    assert passes[0][1] > 150, "the scan alone fills a pass"
    beside = [(names, tokens) for names, tokens, bounded in passes if bounded]
    assert any(set(names) == {"scan", "generate"} for names, _ in beside), passes
    assert all(tokens <= 128 for _, tokens in beside), passes
    assert works["generate"].stats.decode_steps == 5


def test_a_short_job_rides_short_passes_beside_a_scan(runtime, monkeypatch):
    """A short statement arriving during a scan: it cuts into the pass being queued (a pass of its own, all
    its rows), and from its arrival on (for SHORT_WINDOW_S, here longer than the test) every pass holds at
    most SHORT_PASS_TOKENS, so the next short statement of a burst finds a short pass in flight; the scan
    goes on in short passes after it; before it the scan fills its passes."""
    monkeypatch.setattr(scheduler, "SHORT_PASS_TOKENS", 160)
    monkeypatch.setattr(scheduler, "SHORT_WINDOW_S", 600.0)
    rng = np.random.default_rng(9)
    small = runtime.variant("quail", token_budget=256)
    scan = [request(rng.integers(1000, 2000, 30), [7, 9]) for _ in range(40)]
    short = [request(rng.integers(2000, 3000, 20), [7, 9]) for _ in range(5)]
    works = {"scan": QueryWork(), "short": QueryWork()}
    passes = _beside_a_scan(runtime, monkeypatch, small, scan, works, lambda: small.score(short, works["short"]))
    small.scheduler._short_until = 0.0
    assert passes[0][1] > 150, "the scan alone fills its passes"
    assert all(tokens <= 160 for _, tokens, _ in passes[1:]), passes
    assert [names for names, _, _ in passes if "short" in names] == [["short"]], "all its rows in one pass"
    assert passes[-1][0] == ["scan"], "the scan goes on after it"
    passes.clear()
    small.score(short[:1] + [request(rng.integers(2000, 3000, 20), [7, 9])], QueryWork())
    small.score([request(rng.integers(1000, 2000, 100), [7, 9]) for _ in range(3)], QueryWork())
    assert max(tokens for _, tokens, _ in passes) > 150, "a short query alone opens no window: a scan after it fills its pass"


class _Rows:
    """A job as `_share_out` sees it (a query of its own): rows of `length` tokens, as many as its shares
    admit."""

    def __init__(self, count: int, length: int, bounded: bool) -> None:
        self.job, self.count, self.length = self, count, length
        self.pass_tokens = 1 if bounded else None
        self.stats = Stats()
        self.took = 0

    def fill(self, share: Share) -> None:
        while self.took < self.count and share.admits(self.length):
            share.add(self.length)
            self.took += 1


def test_the_first_queries_share_a_pass_and_later_ones_take_what_they_leave_in_order():
    """Five scans queued beside one another: the four that came first take an equal share each, the fifth
    waits. Four small ones first: what they leave goes to the fifth query before the sixth. Two jobs of one
    query (a step's parts) count as one query among the four and take its share together, the later one
    what the earlier leaves."""
    def taken(counts: list[int], same_query: bool = False) -> list[int]:
        jobs = [_Rows(count, 100, bounded=False) for count in counts]
        if same_query:
            jobs[1].stats = jobs[0].stats
        scheduler._share_out(Fill(8000, padded=False), jobs)
        return [job.took for job in jobs]

    assert taken([50] * 5) == [20, 20, 20, 20, 0]
    assert taken([10] * 4 + [50, 50]) == [10] * 4 + [40, 0]
    assert taken([50] * 6, same_query=True) == [20, 0, 20, 20, 20, 0]
    assert taken([5] + [50] * 5, same_query=True) == [5, 15, 20, 20, 20, 0]


def test_bounded_jobs_fill_a_pass_first_and_a_scan_moves_every_other_pass():
    scan, short = _Rows(100, 30, bounded=False), _Rows(5, 20, bounded=True)
    assert not scheduler._share_out(Fill(160, padded=False), [scan, short])
    assert (short.took, scan.took) == (5, 2), "the short job first, all of it; the scan takes what is left"
    scan, shorts = _Rows(100, 30, bounded=False), [_Rows(5, 20, bounded=True) for _ in range(3)]
    assert scheduler._share_out(Fill(100, padded=False), [scan, shorts[0]]), "the scan got nothing"
    assert not scheduler._share_out(Fill(100, padded=False), [scan, shorts[1]], others_first=True)
    assert (scan.took, shorts[1].took) == (2, 2), "then both alike: an equal share each"
    assert scheduler._share_out(Fill(100, padded=False), [scan, shorts[1], shorts[2]])
    assert (shorts[1].took, shorts[2].took) == (5, 2), "bounded jobs share as every job does"
    scan_alone = _Rows(100, 30, bounded=False)
    assert not scheduler._share_out(Fill(100, padded=False), [scan_alone]) and scan_alone.took == 3
