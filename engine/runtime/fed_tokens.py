"""Tokens chosen on the device: fed to the next pass as they are, read by the host a pass later.

A decode step's tokens are chosen on the device (decode.py `choose`). The
next step takes them from there (`Row.fed`, `feed_from_device`), so the host
queues that step without waiting for the one before; it reads the tokens
(`Chosen.read`) while the device computes the next step, and learns only then
which sequences ended.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from quail.engine.kv.pool import on_device

if TYPE_CHECKING:
    from quail.engine.runtime.packing import Row


class Chosen:
    """Tokens on the device (one per row of a pass), on their way to the host: `read` waits for their copy."""

    def __init__(self, tokens: torch.Tensor) -> None:
        if tokens.device.type == "cuda":
            self._host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            self._host.copy_(tokens, non_blocking=True)
            self._copied: torch.cuda.Event | None = torch.cuda.Event()
            self._copied.record()
        else:
            self._host, self._copied = tokens, None

    def read(self) -> list[int]:
        if self._copied is not None:
            self._copied.synchronize()
        return self._host.tolist()


def feed_from_device(ids: torch.Tensor, rows: list[Row], starts: Sequence[int]) -> None:
    """Write into packed token ids on the device (`starts`: each row's first index) the tokens of the rows
    `fed` from a device tensor: one gather and one scatter per tensor, queued, nothing read back."""
    sources: dict[int, tuple[torch.Tensor, list[int], list[int]]] = {}
    for row, start in zip(rows, starts):
        if row.fed is not None:
            tensor, index = row.fed
            _, at, taken = sources.setdefault(id(tensor), (tensor, [], []))
            at.append(start)
            taken.append(index)
    for tensor, at, taken in sources.values():
        ids.index_copy_(0, on_device(ids.device, np.array(at)),
                        tensor.index_select(0, on_device(ids.device, np.array(taken))).to(ids.dtype))
