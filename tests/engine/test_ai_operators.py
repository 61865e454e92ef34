"""AI operators: a large step handed to the runtime in parts answers as one call."""

from __future__ import annotations

import numpy as np
import pytest

from quail.engine.ai.operators import Question, build_requests, yes_probabilities


@pytest.mark.parametrize("strategy", ["quail", "naive"])
def test_a_step_in_parts_answers_as_one_call(runtime, monkeypatch, strategy):
    """Rows of a large step (a small token budget): every row gets the answer its prompt gets alone, NULL
    rows none; quail takes them in two parts in the order of their anchor's text, a baseline in one call
    in table order."""
    small = runtime.variant(strategy, token_budget=48)
    texts = [None if i == 5 else f"Visit {i % 4}: {'the room was cold' if i % 3 else 'lovely staff'} ({i})."
             for i in range(120)]
    launched = []
    launch = type(small).launch
    monkeypatch.setattr(type(small), "launch", lambda self, requests, work=None:
                        launched.append(list(requests)) or launch(self, requests, work))
    probs = yes_probabilities(small, Question("Is {0} a complaint?"), [texts])
    assert len(launched) == (2 if strategy == "quail" else 1), "quail's runtime gets the step in two parts"
    alone = runtime.variant("naive")
    for text, p in zip(texts, probs):
        if text is None:
            assert np.isnan(p)
            continue
        (request,) = build_requests(runtime, Question("Is {0} a complaint?"), [[text]])
        assert abs(p - float(np.exp(alone.score([request])[0][1]))) < 1e-4
    first = [r.segments[1].key for r in launched[0]]
    documents = [r.segments[1] for r in build_requests(runtime, Question("Is {0} a complaint?"),
                                                       [[t] for t in texts if t is not None])]
    if strategy == "quail":
        ordered = sorted(t for t in texts if t is not None)
        want = build_requests(runtime, Question("Is {0} a complaint?"), [[t] for t in ordered[:len(first)]])
        assert first == [r.segments[1].key for r in want], "quail: in the order of the documents' text"
    else:
        assert first == [d.key for d in documents[:len(first)]], "a baseline: in table order"
