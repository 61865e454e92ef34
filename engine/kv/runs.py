"""KV of a run of tokens: the pool slots that hold it, as the runtime keeps it between forward passes."""

from __future__ import annotations

import threading

import numpy as np
import torch

from quail.engine.kv.pool import KVPool, on_device


class KVLedger:
    """Bytes of KV the runner has kept for running queries that one of them still holds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.resident_bytes = 0

    def keep_each(self, runs: list["KV"]) -> None:
        """Count the bytes of these runs (in one pool), each until it is freed, at once."""
        if runs:
            per_token, total = runs[0].parts[0][0].bytes_per_token, 0
            for kv in runs:
                kv.counted = (self, len(kv) * per_token)
                total += kv.counted[1]
            self._add(total)

    def _add(self, size: int) -> None:
        with self._lock:
            self.resident_bytes += size


def runs_of(pool: KVPool, slots: np.ndarray, counts: list[int]) -> list["KV"]:
    """Runs of the consecutive `counts` of these (distinct) slots, each held from now, counted at once."""
    pool.hold(slots)
    ends = np.cumsum(counts).tolist()
    return [KV(((pool, slots[end - count:end]),), held=True) for count, end in zip(counts, ends)]


def end_to_end(runs: list["KV"]) -> tuple[KVPool, np.ndarray] | None:
    """The slots of these runs laid end to end, when they all lie in one pool (one gather reads them all);
    else None."""
    pools = {id(pool) for run in runs for pool, _ in run.parts}
    if len(pools) != 1:
        return None
    return runs[0].parts[0][0], np.concatenate([slots for run in runs for _, slots in run.parts])


class KV:
    """Keys and values of a run of tokens: its slots in one pool or, rarely, several (`parts`, in order).

    A run holds its slots while it lives. A longer run (`then`) or a part of it
    (`slice`) lists the same slots, so a prefix many rows continue is stored once
    whoever holds it. Freed when the last reference goes (no finalizer objects:
    the runtime makes tens of thousands of runs a second, and the cyclic garbage
    collector would walk every one of them).
    """

    __slots__ = ("parts", "_index", "counted")

    def __init__(self, parts: tuple[tuple[KVPool, np.ndarray], ...], held: bool = False) -> None:
        """A run of these slots, which it holds from now on (`held`: the caller counted them for it)."""
        if len(parts) > 1 or (parts and not len(parts[0][1])):
            parts = tuple(part for part in parts if len(part[1]))
        self.parts = parts
        self._index: list[torch.Tensor] | None = None
        self.counted: tuple[KVLedger, int] | None = None  # a ledger counting the run's bytes until it is freed
        if not held:
            for pool, slots in parts:
                pool.hold(slots)

    def __del__(self) -> None:
        for pool, slots in self.parts:
            pool.release(slots)
        if self.counted is not None:
            self.counted[0]._add(-self.counted[1])

    @classmethod
    def of(cls, keys: list[torch.Tensor], values: list[torch.Tensor]) -> "KV":
        """A run of these keys and values (tokens, kv_heads, head_dim) per layer, in a pool of their own."""
        return cls(((KVPool.holding(keys, values), np.arange(keys[0].shape[0])),))

    def __len__(self) -> int:
        return sum(len(slots) for _, slots in self.parts)

    def then(self, after: "KV") -> "KV":
        """This run followed by `after`."""
        parts = list(self.parts)
        for pool, slots in after.parts:
            if parts and parts[-1][0] is pool:
                parts[-1] = (pool, np.concatenate([parts[-1][1], slots]))
            else:
                parts.append((pool, slots))
        return KV(tuple(parts))

    def slice(self, start: int, end: int) -> "KV":
        """Tokens [start, end) of the run."""
        out, offset = [], 0
        for pool, slots in self.parts:
            lo, hi = max(start - offset, 0), min(end - offset, len(slots))
            if lo < hi:
                out.append((pool, slots[lo:hi]))
            offset += len(slots)
        return KV(tuple(out))

    def blocks(self, size: int) -> list["KV"]:
        """The run cut into runs of `size` tokens (the last one short, if so), their slots counted at once."""
        if len(self.parts) != 1:
            return [self.slice(start, start + size) for start in range(0, len(self), size)]
        pool, slots = self.parts[0]
        return runs_of(pool, slots, [min(size, len(slots) - start) for start in range(0, len(slots), size)])

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) of the whole run in one layer: (tokens, kv_heads, head_dim) each, gathered from
        its slots."""
        if self._index is None:
            self._index = [on_device(pool.device, slots.astype(np.int64)) for pool, slots in self.parts]
        keys = [pool.keys[index].index_select(0, at) for (pool, _), at in zip(self.parts, self._index)]
        values = [pool.values[index].index_select(0, at) for (pool, _), at in zip(self.parts, self._index)]
        if len(keys) == 1:
            return keys[0], values[0]
        return torch.cat(keys), torch.cat(values)

