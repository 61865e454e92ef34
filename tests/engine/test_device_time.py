"""The device's busy time (engine/runtime/device_time.py): passes counted as they end, in stream order."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from quail.engine.runtime.device_time import DeviceTime
from quail.engine.runtime.pass_events import PassEvents
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.requests import Request, Segment


@dataclass
class Point:
    """A point of a stream, reached or not, at a millisecond."""

    at: float
    reached: bool = False

    def query(self) -> bool:
        return self.reached

    def elapsed_time(self, other: Point) -> float:
        return other.at - self.at


@dataclass
class Pass:
    start: Point
    end: Point
    inside: list[Pass] = field(default_factory=list)


def test_a_queued_pass_counts_once_it_has_ended_and_passes_count_in_stream_order():
    busy = DeviceTime()
    first, second = Pass(Point(0.0, True), Point(250.0)), Pass(Point(250.0, True), Point(400.0, True))
    busy.add(first, 0.0)
    busy.add(second, 0.0)
    assert busy.seconds() == 0.0, "the first pass still runs; the second, behind it on the stream, waits its turn"
    first.end.reached = True
    assert busy.seconds() == pytest.approx(0.4)
    busy.add(None, 0.125)  # a pass on the caller's thread: its own seconds
    assert busy.seconds() == pytest.approx(0.525)
    cut = Pass(Point(500.0, True), Point(560.0, True))  # a pass cut into the next, between two of its layers
    around = Pass(Point(400.0, True), Point(700.0), [cut])
    busy.add(cut, 0.0)
    busy.add(around, 0.0)
    assert busy.seconds() == pytest.approx(0.585), "the pass cut in counts as it ends"
    around.end.reached = True
    assert busy.seconds() == pytest.approx(0.825), "the pass around it counts its own 240 ms, not the 60 again"


def test_the_schedulers_passes_count_within_the_time_they_took(runtime):
    busy = runtime.scheduler.busy
    rng = np.random.default_rng(3)
    before, began = busy.seconds(), time.perf_counter()
    runtime.score([Request((Segment.of(rng.integers(1000, 2000, 60), "busy"),), runtime.yes_no) for _ in range(4)],
                  QueryWork())
    took = time.perf_counter() - began
    assert 0 < busy.seconds() - before <= took


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA events")
def test_cuda_events_count_the_device_time_between_them():
    busy = DeviceTime()
    a = torch.randn(4096, 4096, device="cuda")
    events = PassEvents(0)
    events.start.record()
    for _ in range(20):
        a = a @ a / 64
    events.end.record()
    busy.add(events, 0.0)
    torch.cuda.synchronize()
    assert busy.seconds() == pytest.approx(events.start.elapsed_time(events.end) / 1000) and busy.seconds() > 0
