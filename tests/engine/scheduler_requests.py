"""What the scheduler's tests share: requests of given tokens, and a runtime's answers to them."""

from __future__ import annotations

import numpy as np

from quail.engine.runtime.requests import LabelSet, Request, Segment


LABELS = LabelSet(("false", "true"), (0, 1), (0, 1))


def request(*segments) -> Request:
    return Request(tuple(Segment.of(np.array(s, dtype=np.int32), "test") for s in segments), LABELS)


def scores(runtime, requests) -> np.ndarray:
    return np.exp(np.array(runtime.score(requests)))
