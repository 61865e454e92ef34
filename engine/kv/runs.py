"""KV of a run of tokens, as the runtime keeps it between forward passes."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import torch


class KVLedger:
    """Bytes of KV the runner has kept that some query still holds (what the device's KV occupies)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.resident_bytes = 0

    def keep(self, kv: "KV", size: int) -> None:
        """Count `size` bytes until the run's tensors are freed: longer runs share its tensor lists
        (KV.then), so its first key tensor lives exactly as long as any of them."""
        self._add(size)
        weakref.finalize(kv.keys[0], self._add, -size)

    def _add(self, size: int) -> None:
        with self._lock:
            self.resident_bytes += size


@dataclass(eq=False)
class KV:
    """Keys and values per layer, each (tokens, kv_heads, head_dim), continuing the run `before`.

    A longer prefix refers to its shorter prefix's KV instead of copying it, so
    every sibling below a radix node shares the node's KV by reference.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    before: "KV | None" = None

    def __len__(self) -> int:
        return self.keys[0].shape[0] + (len(self.before) if self.before is not None else 0)

    def chunks(self) -> list["KV"]:
        """The run's pieces, first to last."""
        out, node = [], self
        while node is not None:
            out.append(node)
            node = node.before
        return out[::-1]

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) of the whole run in one layer: (tokens, kv_heads, head_dim) each."""
        if self.before is None:
            return self.keys[index], self.values[index]
        parts = self.chunks()
        return torch.cat([p.keys[index] for p in parts]), torch.cat([p.values[index] for p in parts])

    def then(self, after: "KV") -> "KV":
        """This run followed by `after` (a run of its own), sharing this run's tensors."""
        return KV(after.keys, after.values, self)

    def slice(self, start: int, end: int) -> "KV":
        """Tokens [start, end) of a single-piece run."""
        return KV([k[start:end] for k in self.keys], [v[start:end] for v in self.values])

    def owned(self) -> "KV":
        """The run's copy as one piece in tensors of its own (a view no longer holds its pass's buffer)."""
        parts = self.chunks()
        return KV([torch.cat([p.keys[i] for p in parts]) for i in range(len(self.keys))],
                  [torch.cat([p.values[i] for p in parts]) for i in range(len(self.values))])
