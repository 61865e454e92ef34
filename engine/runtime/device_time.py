"""The device's busy time: the seconds its forward passes ran, summed as they end."""

from __future__ import annotations

import threading
from collections import deque

from quail.engine.runtime.pass_events import PassEvents


class DeviceTime:
    """Seconds the device spent running forward passes.

    A pass queued on a CUDA stream counts from its
    start event to its end event, once both have been reached (read from any thread, without waiting for
    the device); a pass on the CPU runs on the caller's thread and counts its own wall time. Busy time over
    wall time is the share of time the device had a pass in hand; the rest it waited between passes, for
    the host or for work. Time inside a pass that the device spent waiting for launches the host had not
    queued yet counts as busy (a kernel profile tells the two apart). A pass cut into another counts as it
    ends, and out of the other's time (`PassEvents.inside`; on the CPU, out of the seconds the caller
    gives for the other)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: deque[PassEvents] = deque()  # queued passes not yet counted, in stream order
        self._seconds = 0.0

    def add(self, events: PassEvents | None, seconds: float) -> None:
        """A pass went to the device: its events (CUDA), else the `seconds` it took on the caller's thread."""
        with self._lock:
            if events is None:
                self._seconds += seconds
            else:
                self._running.append(events)
            self._count_ended()

    def seconds(self) -> float:
        """Busy seconds of every pass that has ended (a pass still running counts once it ends)."""
        with self._lock:
            self._count_ended()
            return self._seconds

    def _count_ended(self) -> None:
        while self._running and self._running[0].end.query():
            events = self._running.popleft()
            inside = sum(cut.start.elapsed_time(cut.end) for cut in events.inside)
            self._seconds += (events.start.elapsed_time(events.end) - inside) / 1000
