"""When the owner loop fills the next pass (scheduler.Pacing): the lead's rule (its doctest runs in
tests/test_docs.py), and which gaps it judges.

CUDA events stand in as plain objects here (the rule is host logic); on a GPU the shared-server benchmark's
phase E measures what it is for: a short query joining the pass after the one it arrived in.
"""

from dataclasses import dataclass, field

from quail.engine.runtime.pacing import QUIET, Pacing
from quail.engine.runtime.pass_events import PassEvents


@dataclass
class Point:
    """A recorded point of the device's stream: the millisecond it was reached, and whether it was when asked."""

    at: float
    waited: list = field(default_factory=list)
    reached: bool = False

    def query(self) -> bool:
        return self.reached

    def synchronize(self) -> None:
        self.waited.append(self.at)

    def elapsed_time(self, other: "Point") -> float:
        return other.at - self.at


@dataclass
class Events:
    start: Point
    marked: Point
    end: Point
    reach_mark = PassEvents.reach_mark


def pass_at(start: float, length: float = 10.0) -> Events:
    return Events(Point(start), Point(start + 0.75 * length), Point(start + length))


def test_the_lead_grows_on_gaps_and_shrinks_when_quiet_within_the_layers():
    pacing = Pacing(36)
    assert (pacing.lead, pacing.mark) == (9, 27)
    for _ in range(20):
        pacing.observe(3.0)
    assert pacing.lead == 36 and pacing.mark == 0, "at most the whole pass ahead"
    for _ in range(200 * QUIET):
        pacing.observe(0.2)
    assert pacing.lead == 1 and pacing.mark == 35, "at least the last layer ahead"
    pacing.observe(0.2)
    pacing.observe(2.0)
    assert pacing.lead == 2 and pacing.quiet == 0, "a gap resets the count of quiet passes"


def test_only_passes_queued_one_after_the_other_are_judged():
    pacing = Pacing(36)
    pacing.wait()  # nothing queued: returns at once
    first = pass_at(0.0)
    pacing.queued(first)
    pacing.wait()
    assert first.marked.waited and pacing.lead == 9, "the first pass has nothing before it"
    second = pass_at(15.0)  # 5 ms after the first ended: the host was late
    pacing.queued(second)
    pacing.wait()
    assert second.marked.waited and pacing.lead == 13
    pacing.idle = True  # the loop waited for work: the gap before the next pass is the clients'
    pacing.queued(pass_at(100.0))
    pacing.wait()
    assert pacing.lead == 13
    pacing.queued(None)  # the CPU: no events
    pacing.wait()
    assert pacing.lead == 13


def test_a_mark_the_device_has_passed_is_not_waited_for():
    """Waiting lets go of the interpreter's lock, which the loop may then wait for behind other threads."""
    pacing = Pacing(36)
    behind = pass_at(0.0)
    behind.marked.reached = True
    pacing.queued(behind)
    pacing.wait()
    assert not behind.marked.waited
