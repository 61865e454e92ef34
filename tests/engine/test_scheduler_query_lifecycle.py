"""A query's start and end in the scheduler: refused before any pass, under way, cancelled or broken between passes."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from quail.engine.ai.asking import Question, yes_probabilities
from quail.engine.errors import InvalidArgument
from quail.engine.runtime import model_runner
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.query_work import QueryWork
from tests.engine.scheduler_requests import request, scores


class BrokenFill:
    """A job whose pass breaks as it is filled, before any row: the owner loop ends it with that error."""

    pass_tokens = None

    def __init__(self, runtime) -> None:
        self.runner, self.stats = runtime.runner, Stats()

    def done(self) -> bool:
        return False

    def fill(self, fill) -> None:
        raise RuntimeError("a broken fill")


def test_a_prompt_longer_than_the_context_is_refused_before_any_pass(runtime, monkeypatch):
    monkeypatch.setattr(type(runtime.runner), "passing", lambda *a: pytest.fail("no pass may run"))
    too_long = request(np.ones(runtime.config.max_position + 1, dtype=np.int32))
    with pytest.raises(InvalidArgument, match=f"reads at most {runtime.config.max_position:,}"):
        runtime.score([request([1, 2, 3]), too_long], QueryWork())
    text = "word " * runtime.config.max_position
    with pytest.raises(InvalidArgument, match="a text beginning 'word word"):
        yes_probabilities(runtime, Question("Is {0} long?"), [["short", text]])


def test_a_step_past_the_token_limit_is_refused_before_any_pass(runtime, monkeypatch):
    from quail.engine.errors import ResourceExhausted

    texts = [f"review {i}: " + "the soup was cold " * 40 for i in range(40)]  # a step in two parts
    work = QueryWork(max_tokens=2000)
    monkeypatch.setattr(type(runtime.runner), "passing", lambda *a: pytest.fail("no pass may run"))
    with pytest.raises(ResourceExhausted, match="more than 2,000 tokens"):
        yes_probabilities(runtime.variant("quail", token_budget=256), Question("Is {0} kind?"), [texts], work)
    assert work.stats.forward_passes == 0 and work.stats.logical_tokens == 0


@pytest.mark.parametrize("opening", [None, 4], ids=["cpu", "four-layers"])
def test_a_query_is_under_way_once_the_host_queued_the_opening_layers_of_its_first_pass(runtime, monkeypatch,
                                                                                        opening):
    """QueryWork.under_way (what a prepared query's result schema waits for, server/query_service.py) is set
    by the first pass holding the query's rows once the host has queued that pass's opening layers: not
    before the pass, and not only at its end. On the CPU, from the pass's start; on CUDA (its count of
    layers here on the CPU), from that layer on."""
    if opening is not None:
        monkeypatch.setattr(model_runner, "opening_layers", lambda device: opening)
    work, layers, entered = QueryWork(), [], []
    model = runtime.runner.model
    finish, forward = type(model).finish, type(runtime.runner).passing

    def recording(self, layer, *args):
        layers.append((layer, work.under_way.is_set()))
        return finish(self, layer, *args)

    def entering(self, groups, *rest):
        entered.append(work.under_way.is_set())
        return forward(self, groups, *rest)

    monkeypatch.setattr(type(model), "finish", recording)
    monkeypatch.setattr(type(runtime.runner), "passing", entering)
    runtime.score([request(np.arange(1000, 1040), [7, 9])], work)
    assert work.under_way.is_set() and len(model.layers) > model_runner.OPENING_LAYERS
    assert entered == [False] and len(layers) == len(model.layers), "one pass, not under way before it"
    assert [layer for layer, under_way in layers if under_way][0] == (opening or 0)


def _cancelled_after(passes: int) -> QueryWork:
    """A query's work that is cancelled at its first check after `passes` forward passes."""
    work = QueryWork()
    original = work.check

    def check() -> None:
        if work.stats.forward_passes >= passes:
            work.cancel()
        original()

    work.check = check
    return work


def test_a_cancelled_query_leaves_before_the_next_pass(runtime):
    """A query whose check raises between passes gets that error and has no rows in any later pass;
    the query beside it finishes with its own answers."""
    from quail.engine.errors import Cancelled

    rng = np.random.default_rng(8)
    small = runtime.variant("quail", token_budget=256)
    long = [request(rng.integers(1000, 2000, 100), [7, 9]) for _ in range(24)]
    other = [request(rng.integers(2000, 3000, 100), [7, 9]) for _ in range(12)]
    alone = scores(small, other)
    cancelled, errors, got = _cancelled_after(2), [], {}

    def cancelling() -> None:
        try:
            small.score(long, cancelled)
        except Cancelled as err:
            errors.append(err)

    thread = threading.Thread(target=cancelling)
    thread.start()
    got["other"] = np.exp(np.array(small.score(other)))
    thread.join(60)
    assert errors and cancelled.stats.forward_passes == 2, "it ran no pass after it was cancelled"
    np.testing.assert_allclose(got["other"], alone, atol=1e-4)


def test_a_cancelled_query_s_kv_goes_with_its_error(runtime):
    """The error a query cancelled between passes gets carries its frames (its job, its runs of KV); once
    the caller drops it, none of the query's KV is held: no reference cycle through the scheduler keeps it
    until a garbage collection."""
    from quail.engine.errors import Cancelled

    rng = np.random.default_rng(9)
    small = runtime.variant("quail", token_budget=256)
    documents = [rng.integers(1000, 2000, 120) for _ in range(12)]  # the questions continue their KV
    prompts = [request(document, rng.integers(100, 200, 4), [7, 9]) for document in documents for _ in range(3)]
    cancelled = _cancelled_after(2)
    gc.disable()
    try:
        try:
            small.score(prompts, cancelled)
        except Cancelled:
            pass
        assert cancelled.stats.forward_passes == 2 and small.runner.ledger.resident_bytes == 0
    finally:
        gc.enable()


def test_a_job_that_breaks_its_pass_gets_the_error_and_the_loop_goes_on(runtime):
    """A fault outside any one query's rows (here: filling the pass) ends the queries of that pass with
    it; the scheduler goes on serving the next ones."""
    with pytest.raises(RuntimeError, match="a broken fill"):
        runtime.scheduler.run(BrokenFill(runtime))
    assert len(runtime.score([request([1, 2, 3])])) == 1
