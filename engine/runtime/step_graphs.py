"""Decode steps on CUDA replayed from captured graphs: a step's layers cost one launch, not hundreds of host calls.

A graph is captured per batch bucket: the batch padded to the next power of
two, from MIN_BATCH to MAX_BATCH sequences (the runner runs a larger step
eagerly: its host calls are few for its size). Every graph reads one set of static
inputs: token ids, positions, new slots and lengths (a (4, MAX_BATCH)
tensor) and a slot table as wide as the model's context, of which a step
copies only the columns its longest sequence uses. Padding rows compute a
token of id 0 at position 0 whose keys go to a scratch slot the graphs hold,
and attend to it alone. Inputs go through pinned staging buffers, reused
once the copies that read them have run. Graphs share one memory pool and
live as long as the runner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from quail.engine.kv.pool import KVPool
from quail.engine.kv.runs import KV
from quail.engine.model.decoder import Decoder
from quail.engine.runtime.fed_tokens import feed_from_device

if TYPE_CHECKING:
    from quail.engine.runtime.packing import Row

MIN_BATCH = 8
MAX_BATCH = 1024


def bucket(n: int) -> int:
    """The batch a step of n sequences is padded to: the next power of two, at least MIN_BATCH.

    >>> bucket(3), bucket(9), bucket(256), bucket(257)
    (8, 16, 256, 512)
    """
    return max(MIN_BATCH, 1 << max(0, n - 1).bit_length())


class StepGraphs:
    """Captured decode steps of one model over one pool (CUDA).

    `__call__` runs a step as Decoder.decode
    does, from host arrays. Its buffers are allocated, and its scratch slot taken, on first use (`usable`)."""

    def __init__(self, model: Decoder, pool: KVPool) -> None:
        self.model, self.pool = model, pool
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # bucket: (graph, hidden states)
        self.memory = torch.cuda.graph_pool_handle()
        self._scratch: KV | None = None  # the slot padding rows write to, held while the graphs live
        self._buffers: tuple[torch.Tensor, ...] = ()  # inputs, table; their pinned staging copies
        self._copied = torch.cuda.Event()

    def usable(self) -> bool:
        """Whether steps can run here (a scratch slot taken from the pool, once)."""
        if self._scratch is None:
            slots = self.pool.take(1)
            if slots is None:
                return False
            self._scratch = KV(((self.pool, slots),))
            width, device = self.model.config.max_position, self.pool.device
            inputs, table = torch.zeros(4, MAX_BATCH, dtype=torch.int64), torch.zeros(MAX_BATCH, width, dtype=torch.int32)
            self._buffers = (inputs.to(device), table.to(device), inputs.pin_memory(), table.pin_memory())
        return True

    def prepare(self) -> None:
        """Capture every bucket's graph now (a server's warm-up), not at its first step."""
        if self.usable():
            for size in range(MIN_BATCH.bit_length() - 1, MAX_BATCH.bit_length()):
                if 1 << size not in self.graphs:
                    self._capture(1 << size)

    def __call__(self, ids: np.ndarray, positions: np.ndarray, slots: np.ndarray, table: np.ndarray,
                 lengths: np.ndarray, rows: list[Row]) -> torch.Tensor:
        """The final hidden states (sequences, hidden) of a decode step of at most MAX_BATCH sequences
        (Decoder.decode's arguments, on the host, but the ids of the `rows` fed from the device; `usable`
        first)."""
        n = len(ids)
        size = bucket(n)
        graph, out = self.graphs.get(size) or self._capture(size)
        self._stage(ids, positions, slots, table, lengths, size)
        feed_from_device(self._buffers[0][0], rows, range(n))
        graph.replay()
        return out[:n].clone()  # the next replay overwrites `out`

    def _stage(self, ids: np.ndarray, positions: np.ndarray, slots: np.ndarray, table: np.ndarray,
               lengths: np.ndarray, size: int) -> None:
        """A step's inputs in the static buffers (copied on the current stream), padding rows up to `size`."""
        inputs, device_table, staged, staged_table = self._buffers
        self._copied.synchronize()  # the last step's copies have read the staging buffers
        n, width = len(ids), max(table.shape[1], 1)
        host, host_table = staged.numpy(), staged_table.numpy()
        host[:, n:size] = np.array([[0], [0], [self._scratch.parts[0][1][0]], [1]])
        host[0, :n], host[1, :n], host[2, :n], host[3, :n] = ids, positions, slots, lengths
        host_table[n:size, 0] = self._scratch.parts[0][1][0]
        host_table[:n, :table.shape[1]] = table
        inputs.copy_(staged, non_blocking=True)
        device_table[:size, :width].copy_(staged_table[:size, :width], non_blocking=True)
        self._copied.record()

    def _capture(self, size: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """The graph of a step of `size` rows: run twice on a side stream first (compiled layers and
        kernels built outside the capture), then captured."""
        self._stage(*(np.zeros(0, np.int64) for _ in range(3)), np.zeros((0, 0), np.int32), np.zeros(0, np.int64),
                    size)
        inputs, table = self._buffers[0][:, :size], self._buffers[1][:size]

        def step() -> torch.Tensor:
            ids, positions, slots, lengths = inputs
            return self.model.decode(ids, positions, slots, table, lengths.int(), self.pool.keys, self.pool.values)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.memory):
            out = step()
        self.graphs[size] = (graph, out)
        return graph, out
