"""The device's KV pool: keys and values of every layer in token slots, each slot counted by the runs holding it.

Forward passes write the K/V of the tokens they keep straight into free slots
(one scatter per layer); a run of tokens is the list of its slots (kv/runs.py),
so keeping a prefix, sharing it between queries or cutting it in two copies
nothing: runs hold slots, and a slot is free again when the last run holding it
is gone. Slots are single tokens (a page of one): no page is ever part-empty,
and attention gathers a run's keys through its slot list. When no slot is free,
the pool asks its `evict` hook (the resident tree, kv/resident.py) to let go
of least-needed runs first.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

import numpy as np
import torch

from quail.engine.kv.rows import copy_rows


def on_device(device: torch.device, array: np.ndarray) -> torch.Tensor:
    """A host array on the device without waiting for the work queued there (pinned, non-blocking)."""
    host = torch.from_numpy(np.ascontiguousarray(array))
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host


ALIGN = 16  # bytes: where each array of a joint copy starts (any element type's alignment)


def on_device_all(device: torch.device, arrays: Sequence[np.ndarray | None]) -> list[torch.Tensor | None]:
    """Host arrays on the device in one copy (pinned, non-blocking; None stays None): each array at an
    aligned offset of one staged buffer, and each tensor a view of the buffer on the device, of the array's
    dtype and shape. A pass's index arrays go up together: each copy of its own costs the host ~50 µs."""
    arrays = [None if a is None else np.ascontiguousarray(a) for a in arrays]
    if device.type != "cuda":
        return [None if a is None else torch.from_numpy(a) for a in arrays]
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += 0 if a is None else -(-a.nbytes // ALIGN) * ALIGN
    staged = torch.empty(max(total, ALIGN), dtype=torch.uint8, pin_memory=True)
    host = staged.numpy()
    for a, at in zip(arrays, offsets):
        if a is not None:
            host[at:at + a.nbytes] = a.reshape(-1).view(np.uint8)
    moved = staged.to(device, non_blocking=True)
    return [None if a is None else moved[at:at + a.nbytes].view(torch.from_numpy(a[:0]).dtype).view(a.shape)
            for a, at in zip(arrays, offsets)]


def token_bytes(layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of one token's keys and values over all layers."""
    return 2 * layers * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()


class KVPool:
    """Keys and values (slots, kv_heads, head_dim) per layer, and how many runs hold each slot."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 slots: int, tensors: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None) -> None:
        """`tensors`: the keys and values to hold (a run made of tensors computed elsewhere); else empty ones."""
        if tensors is None:
            tensors = tuple([torch.empty(slots, kv_heads, head_dim, dtype=dtype, device=device)
                             for _ in range(layers)] for _ in range(2))
        self.keys, self.values = tensors
        self.device = torch.device(device)
        self.slots = slots
        self.bytes_per_token = token_bytes(layers, kv_heads, head_dim, dtype)
        self.refs = np.zeros(slots, dtype=np.int32)
        self._free = np.arange(slots - 1, -1, -1, dtype=np.int64)  # a stack: the top at the end
        self._top = slots
        self._released: list[np.ndarray] = []  # slot lists runs let go of, not yet counted
        self._where = np.empty(slots, dtype=np.int64)  # scratch for `_settle`
        self._lock = threading.Lock()
        self.evict: Callable[[int], None] | None = None

    @classmethod
    def like(cls, pool: "KVPool", slots: int) -> "KVPool":
        """A pool of `slots` slots of the same shape, on the same device (what a pass keeps when the pool
        itself is full of runs still needed; freed with the last run holding it)."""
        k = pool.keys[0]
        return cls(len(pool.keys), k.shape[1], k.shape[2], k.dtype, k.device, slots)

    @classmethod
    def holding(cls, keys: list[torch.Tensor], values: list[torch.Tensor]) -> "KVPool":
        """A pool whose slots are these tensors' tokens (tokens, kv_heads, head_dim) per layer, none free."""
        k = keys[0]
        pool = cls(len(keys), k.shape[1], k.shape[2], k.dtype, k.device, k.shape[0], (keys, values))
        pool._top = 0
        return pool

    @property
    def free(self) -> int:
        with self._lock:
            self._settle()
            return self._top

    @property
    def capacity_bytes(self) -> int:
        """Bytes of keys and values its slots hold."""
        return self.slots * self.bytes_per_token

    @property
    def used(self) -> int:
        return self.slots - self.free

    def take(self, count: int) -> np.ndarray | None:
        """`count` free slots (held by nobody until a run holds them), evicting first if needed; None:
        not that many can be freed."""
        short = count - self.free
        if short > 0 and self.evict is not None:
            self.evict(short)
        with self._lock:
            self._settle()
            if count > self._top:
                return None
            taken = self._free[self._top - count:self._top][::-1].copy()
            self._top -= count
            return taken

    def hold(self, slots: np.ndarray) -> None:
        """One more run holds these (distinct) slots."""
        with self._lock:
            self.refs[slots] += 1

    def release(self, slots: np.ndarray) -> None:
        """One run less holds these slots (counted at the next `take` or `free`: a run may be freed by the
        garbage collector at any allocation, even one inside this pool's own work, so this only notes it)."""
        self._released.append(slots)

    def _settle(self) -> None:
        """Count the released slots (the lock held); those no run holds are free. Each list is counted down
        as `hold` counted it up (its slots distinct); a slot that two runs released is freed once: of its
        places among the freed, the one `_where` ends up holding."""
        if not self._released:
            return
        released, self._released = self._released, []
        for slots in released:
            self.refs[slots] -= 1
        gone = np.concatenate(released)
        freed = gone[self.refs[gone] == 0]
        places = np.arange(len(freed))
        self._where[freed] = places
        freed = freed[self._where[freed] == places]
        self._free[self._top:self._top + len(freed)] = freed
        self._top += len(freed)

    def write(self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store one layer's keys and values (tokens, kv_heads, head_dim) in `slots` (on the device)."""
        copy_rows(self.keys[layer], slots, keys)
        copy_rows(self.values[layer], slots, values)


RESERVE = 4 << 30  # GPU memory a pool leaves to kernels' workspaces, compiled graphs and the allocator's slack


def default_pool_bytes(device: torch.device, pass_bytes: int = 0) -> int:
    """1 GiB on the CPU. On a GPU, 90% of the memory free once the weights are loaded, less RESERVE and
    `pass_bytes` (room for a forward pass's activations); 0 where that leaves nothing."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return max(0, int(0.9 * (free - RESERVE - pass_bytes)))
    return 1 << 30
