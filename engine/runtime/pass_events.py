"""Points a forward pass records on the device's stream, and waiting for the device to reach them (CUDA).

The owner loop paces itself by them (pacing.py), cut-ins wait on them (scheduler.py) and the device's busy
time is counted from them (device_time.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def _reached(event: torch.cuda.Event) -> None:
    """Until the device reaches `event`. One already passed is only asked about: waiting lets go of the
    interpreter's lock, and taking it back may wait behind other threads (statements being planned) while
    the device runs out of queued work."""
    if not event.query():
        event.synchronize()


@dataclass(eq=False)
class PassEvents:
    """Points a pass records on the device's stream (CUDA only).

    Its start, the start of layer `mark`, its end,
    the start of each layer the host reached in a pass that work may cut into; and those of the passes cut
    into it."""

    mark: int
    start: torch.cuda.Event = field(default_factory=lambda: torch.cuda.Event(enable_timing=True))
    marked: torch.cuda.Event = field(default_factory=lambda: torch.cuda.Event(blocking=True))
    end: torch.cuda.Event = field(default_factory=lambda: torch.cuda.Event(enable_timing=True))
    inside: list["PassEvents"] = field(default_factory=list)  # passes cut into this one, between its layers
    layers: list[torch.cuda.Event] = field(default_factory=list)  # each layer's start, as the host queues them

    def reach_mark(self) -> None:
        """Until the device starts layer `mark`."""
        _reached(self.marked)

    def layer_queued(self) -> None:
        """Record the start of the next layer, the host having queued the layers before it."""
        self.layers.append(torch.cuda.Event(blocking=True))
        self.layers[-1].record()

    def reach_layer(self, layer: int) -> None:
        """Until the device starts `layer` (one the host has queued)."""
        _reached(self.layers[layer])
