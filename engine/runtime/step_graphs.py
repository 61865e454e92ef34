"""Decode steps on CUDA replayed from captured graphs: a step's layers cost one launch, not hundreds of host calls.

A graph is captured per (batch bucket, table width): the batch padded to the
next power of two (at least MIN_BATCH), the slot table to the next power of
two of columns (at least MIN_WIDTH). Padding rows compute a token of id 0 at
position 0 whose keys go to a scratch slot the graphs hold, and attend to it
alone. Inputs go through pinned staging buffers and one copy each; the
staging buffers are reused once the copies that read them have run. Graphs
share one memory pool and are kept for the life of the runner.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from quail.engine.kv.pool import KVPool
from quail.engine.kv.runs import KV
from quail.engine.model.decoder import Decoder

MIN_BATCH = 8
MIN_WIDTH = 256


def bucket(n: int, least: int) -> int:
    """The next power of two ≥ n, at least `least`.

    >>> bucket(3, 8), bucket(9, 8), bucket(300, 256)
    (8, 16, 512)
    """
    return max(least, 1 << max(0, n - 1).bit_length())


@dataclass(eq=False)
class _Graph:
    """One captured step: its static inputs (ids, positions, slots, lengths as rows of `inputs`; `table`),
    their pinned staging copies, the output hidden states, and the event after the inputs' copies."""

    inputs: torch.Tensor
    table: torch.Tensor
    staged: torch.Tensor
    staged_table: torch.Tensor
    copied: torch.cuda.Event
    graph: torch.cuda.CUDAGraph | None = None
    out: torch.Tensor | None = None

    @classmethod
    def empty(cls, batch: int, width: int, device: torch.device) -> "_Graph":
        return cls(torch.zeros(4, batch, dtype=torch.int64, device=device),
                   torch.zeros(batch, width, dtype=torch.int32, device=device),
                   torch.zeros(4, batch, dtype=torch.int64).pin_memory(),
                   torch.zeros(batch, width, dtype=torch.int32).pin_memory(), torch.cuda.Event())

    def stage(self, ids: np.ndarray, positions: np.ndarray, slots: np.ndarray, table: np.ndarray,
              lengths: np.ndarray, scratch: int) -> None:
        """The step's inputs in the static buffers (copied on the current stream), padding rows after them."""
        self.copied.synchronize()  # the last step's copies have read the staging buffers
        n = len(ids)
        staged, staged_table = self.staged.numpy(), self.staged_table.numpy()
        staged[:, n:] = np.array([[0], [0], [scratch], [1]])
        staged[0, :n], staged[1, :n], staged[2, :n], staged[3, :n] = ids, positions, slots, lengths
        staged_table[n:, 0] = scratch
        staged_table[:n, :table.shape[1]] = table
        self.inputs.copy_(self.staged, non_blocking=True)
        self.table.copy_(self.staged_table, non_blocking=True)
        self.copied.record()

    def run(self, model: Decoder, pool: KVPool) -> torch.Tensor:
        ids, positions, slots, lengths = self.inputs
        return model.decode(ids, positions, slots, self.table, lengths.int(), pool.keys, pool.values)


class StepGraphs:
    """Captured decode steps of one model over one pool (CUDA): `__call__` runs a step as Decoder.decode
    does, from host arrays."""

    def __init__(self, model: Decoder, pool: KVPool) -> None:
        self.model, self.pool = model, pool
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.memory = torch.cuda.graph_pool_handle()
        self._scratch: KV | None = None  # the slot padding rows write to, held while the graphs live

    def usable(self) -> bool:
        """Whether steps can run here: a scratch slot for padding rows is taken (once) from the pool."""
        if self._scratch is None:
            slots = self.pool.take(1)
            if slots is None:
                return False
            self._scratch = KV(((self.pool, slots),))
        return True

    def __call__(self, ids: np.ndarray, positions: np.ndarray, slots: np.ndarray, table: np.ndarray,
                 lengths: np.ndarray) -> torch.Tensor:
        """The final hidden states (sequences, hidden) of a decode step (Decoder.decode's arguments, on the
        host; `usable` first)."""
        key = (bucket(len(ids), MIN_BATCH), bucket(table.shape[1], MIN_WIDTH))
        graph = self.graphs.get(key) or self._capture(*key)
        graph.stage(ids, positions, slots, table, lengths, int(self._scratch.parts[0][1][0]))
        graph.graph.replay()
        return graph.out[:len(ids)].clone()  # the next replay overwrites `out`

    def _capture(self, batch: int, width: int) -> _Graph:
        """A graph of a step of `batch` rows and a table of `width` columns: run twice on a side stream
        first (compiled layers and kernels built outside the capture), then captured."""
        graph = _Graph.empty(batch, width, self.pool.device)
        graph.stage(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                    np.zeros((0, 0), np.int32), np.zeros(0, np.int64), int(self._scratch.parts[0][1][0]))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                graph.run(self.model, self.pool)
        torch.cuda.current_stream().wait_stream(side)
        graph.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph.graph, pool=self.memory):
            graph.out = graph.run(self.model, self.pool)
        self.graphs[(batch, width)] = graph
        return graph
