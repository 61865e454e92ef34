"""When the owner loop fills the next pass: a lead of layers before the pass in flight ends, learned from gaps.

The loop fills the next pass once the device has started layer `layers - lead` of the one in flight; the
lead grows after a pass the device waited for the host before, and shrinks after QUIET passes without.
"""

from __future__ import annotations

from quail.engine.runtime.pass_events import PassEvents

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
