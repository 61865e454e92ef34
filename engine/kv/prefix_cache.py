"""Documents' KV kept between AI steps and queries: a byte-bounded, least-recently-used prefix cache.

Every prompt begins [preamble][first document] (runtime/prompt.py): a filter's document
and a join's anchor. The quail strategy looks that prefix up here before
computing, and, in a query that asks the model more than once, stores the KV of
the prefixes it computes; so a later filter on the same document, a join
anchored on it, or a later query over the same table continues from it instead
of computing it again. Keys name the prefix's content (its segments' keys).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from quail.engine.kv.runs import KV

def kv_bytes(kv: KV) -> int:
    return sum(t.nbytes for piece in kv.chunks() for t in (*piece.keys, *piece.values))


class PrefixCache:
    """KV of prompt prefixes by content key, within `budget_bytes`; the least recently used go first."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.resident_bytes = 0
        self._entries: OrderedDict[bytes, tuple[KV, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: bytes) -> KV | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: bytes, kv: KV) -> None:
        """Keep a run (evicting the least recently used); one larger than the budget is not kept. A chained
        run's earlier pieces (a preamble many documents continue) count in every entry holding them."""
        size = kv_bytes(kv)
        if size > self.budget_bytes:
            return
        with self._lock:
            if key in self._entries:
                return
            while self.resident_bytes + size > self.budget_bytes:
                _, (_, freed) = self._entries.popitem(last=False)
                self.resident_bytes -= freed
            self._entries[key] = (kv, size)
            self.resident_bytes += size

    def drop(self, key: bytes) -> None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self.resident_bytes -= entry[1]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.resident_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)


def default_budget(device: torch.device) -> int:
    """1 GiB on the CPU; a quarter of a GPU's memory (the measurements behind it: bench/GPU_NOTES.md)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // 4
    return 1 << 30
