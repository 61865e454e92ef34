"""AI operators: a large step handed to the runtime in parts answers as one call."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pyarrow as pa
import pytest

from quail.engine.ai.asking import Question, build_requests, yes_probabilities

SMALL_MODEL = True  # what these tests check holds for any model's arithmetic (tests/small_model.py)

STEP = [None if i == 5 else f"Visit {i % 4}: {'the room was cold' if i % 3 else 'lovely staff'} ({i})."
        for i in range(30)]
COMPLAINT = Question("Is {0} a complaint?")


@pytest.fixture(scope="module")
def alone(runtime):
    """The answer each row of STEP with a text (by row) gets to its prompt alone: each row its own prompt,
    nothing shared (the naive strategy; computed once for both tests below)."""
    present = [i for i, text in enumerate(STEP) if text is not None]
    requests = build_requests(runtime, COMPLAINT, [[STEP[i]] for i in present])
    return dict(zip(present, (float(np.exp(a[1])) for a in runtime.variant("naive").score(requests))))


@pytest.mark.parametrize("strategy", ["quail", "naive"])
def test_a_step_in_parts_answers_as_one_call(runtime, alone, monkeypatch, strategy):
    """Rows of a large step (for quail, a small token budget): every row gets the answer its prompt gets alone, NULL
    rows none; quail takes them in two parts in the order of their anchor's text, the rest reaching the
    runtime (on a thread) before the head's passes are all queued, so the device need not wait for the host
    between them; a baseline in one call in table order."""
    small = runtime.variant(strategy, token_budget=24 if strategy == "quail" else 1024)  # a baseline: one call anyway
    launched, rest_came = [], threading.Event()
    launch = type(small).launch

    def launching(self, requests, work=None):
        if threading.current_thread() is not threading.main_thread():
            rest_came.set()
        elif strategy == "quail":
            assert rest_came.wait(60), "the rest was not queued while the head's passes were"
        launched.append(list(requests))
        return launch(self, requests, work)

    monkeypatch.setattr(type(small), "launch", launching)
    probs = yes_probabilities(small, COMPLAINT, [STEP])
    assert len(launched) == (2 if strategy == "quail" else 1), "quail's runtime gets the step in two parts"
    assert np.isnan(probs[5])
    assert np.allclose([probs[i] for i in alone], list(alone.values()), atol=1e-4, rtol=0)
    parts = [[r.segments[1].key for r in part] for part in launched]
    texts = [t for t in STEP if t is not None]
    if strategy == "quail":  # the head and the rest are queued side by side: either may reach the runtime first
        ordered = [r.segments[1].key for r in build_requests(runtime, COMPLAINT, [[t] for t in sorted(texts)])]
        assert ordered in (parts[0] + parts[1], parts[1] + parts[0]), "quail: in the order of the documents' text"
    else:
        assert parts[0] == [r.segments[1].key for r in build_requests(runtime, COMPLAINT, [[t] for t in texts])], \
            "a baseline: in table order"


def test_resident_share_is_of_the_document_prefixes_the_operators_computed(runtime):
    """The documents a filter computed are resident as its placeholder's ({0}), not as another's, and other
    texts are not; half of them computed, about half their tokens; looking leaves the hit rate alone."""
    texts = [f"Note {i}: the soup was {'cold' if i % 2 else 'warm'} and the bread {'stale' if i % 3 else 'fresh'}."
             for i in range(8)]
    column = pa.chunked_array([texts[:4], [None, *texts[4:]]])
    assert runtime.resident_share(column, 0) == 0.0
    yes_probabilities(runtime, Question("Is {0} a complaint?"), [texts[:4]])
    assert 0.4 < runtime.resident_share(column, 0) < 0.6
    yes_probabilities(runtime, Question("Is {0} about food?"), [texts])
    counts = dataclasses.replace(runtime.runner.tree.counts)
    assert runtime.resident_share(column, 0) == 1.0
    assert runtime.resident_share(column, 1) == 0.0, "as {1}'s documents they read 'Text 2:'"
    assert runtime.resident_share(pa.chunked_array([["A text no query read."]]), 0) == 0.0
    assert runtime.runner.tree.counts == counts
