"""The lower KV tiers: what the pool has no room for, in host memory or a disk's file until a request continues it.

The resident tree (kv/resident.py) moves its least valuable runs here instead
of dropping them, and copies them back into the pool when a request matches
them, if that is cheaper than computing them again (`restores`: for the host
tier, both timed end to end on this machine when the server warms up).

- Host memory is one store of token slots, all of a token's layers together, so a
  run is a few contiguous extents: one copy each way per extent.
- The store is reserved, not touched, at start, and on a GPU a thread of its own pins
  it (registers it with CUDA) PIN_CHUNK_BYTES at a time, in the order runs fill it,
  ahead of them: a tier of most of the host's memory costs nothing at start-up, and
  pinning (about a second per GiB, the pages first touched) stays off the passes'
  path; a run that goes where the thread has not reached yet pins its chunk itself.
- On a GPU the copies run on streams of their own, one each way: a run comes back
  while the passes before it still compute, and the pass that reads it waits for it,
  not the host and not the runs going out (a run comes back after its own copy out).
- The disk tier is the same store in a file of a local disk (`path`; unlinked at
  once, so nothing is left behind), behind the host tier: runs the host tier has no
  room for move there (`move`), and come back into the pool from there directly.
"""

from __future__ import annotations

import bisect
import math
import os
import shutil
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from quail.engine.kv.pool import KVPool, on_device
from quail.engine.kv.runs import KV

PIN_CHUNK_BYTES = 256 << 20  # host memory pinned at once, the first time a run goes there
STAGE_BYTES = 1 << 30  # KV staged on the device per gather of an offload (a larger eviction goes in groups)
PAGE = 4096
HOST_SHARE = 0.5  # of the host memory available at start, the default host tier's (shared by its replicas)
CGROUP_MEMORY = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # a container's limit and use
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


@dataclass
class HostRun:
    """A run of tokens in a lower tier's store, as extents of slots.

    A run of tokens in the host store: (first slot, count) extents, in token order; on a GPU, the event
    that its copy out has been made (`copied`)."""

    extents: list[tuple[int, int]]
    copied: torch.cuda.Event | None = None
    tier: "HostTier | None" = None  # the tier whose store holds it

    def __len__(self) -> int:
        return sum(count for _, count in self.extents)

    def split(self, at: int) -> tuple["HostRun", "HostRun"]:
        """Its first `at` tokens and the rest."""
        head: list[tuple[int, int]] = []
        tail: list[tuple[int, int]] = []
        seen = 0
        for start, count in self.extents:
            if seen + count <= at:
                head.append((start, count))
            elif seen >= at:
                tail.append((start, count))
            else:
                head.append((start, at - seen))
                tail.append((start + at - seen, count - (at - seen)))
            seen += count
        return HostRun(head, self.copied, self.tier), HostRun(tail, self.copied, self.tier)


@dataclass
class _Restore:
    """A copy back owed before the next pass reads the pool: a run's host extents into these slots."""

    run: HostRun
    kv: KV


class HostTier:
    """Slots for runs of one device pool, in host memory or a disk's file.

    Host slots (slots, keys|values, layers, kv_heads, head_dim) for runs of one device pool: in memory,
    pinned as it fills on a GPU; or, given a `path`, in that file (the disk tier)."""

    def __init__(self, pool: KVPool, slots: int, path: Path | None = None) -> None:
        k = pool.keys[0]
        self.pool = pool
        self.slots = slots
        self.bytes_per_token = pool.bytes_per_token
        on_gpu = pool.device.type == "cuda"
        shape = (slots, 2, len(pool.keys), k.shape[1], k.shape[2])
        self.on_disk = path is not None
        self.store = _in_file(shape, k.dtype, path) if path is not None else _page_aligned(shape, k.dtype)
        slot_bytes = self.store.stride(0) * self.store.element_size()
        whole_pages = PAGE // math.gcd(slot_bytes, PAGE)  # slots a chunk is a multiple of: chunks share no page
        self._chunk_slots = max(1, PIN_CHUNK_BYTES // slot_bytes // whole_pages) * whole_pages
        self._pinned = _Pinned() if on_gpu and not self.on_disk else None
        if self._pinned is not None:
            weakref.finalize(self, _unpin, self.store, self._pinned, self._chunk_slots)
            device = pool.device.index if pool.device.index is not None else torch.cuda.current_device()
            threading.Thread(target=_pin_ahead, args=(weakref.ref(self), -(-slots // self._chunk_slots), device),
                             name="quail-host-pinning", daemon=True).start()
        self.out = torch.cuda.Stream(pool.device) if on_gpu else None  # copies to the host
        self.back = torch.cuda.Stream(pool.device) if on_gpu else None  # copies back to the device
        self._free: list[tuple[int, int]] = [(0, slots)] if slots else []  # by first slot, none adjacent
        self.used = 0
        self._owed: list[_Restore] = []
        # A pass's worth of new prompts, timed computed, then moved here and timed copied back with their last
        # tokens computed (Runtime.warm_up): seconds each way, None until timed.
        self.recompute_s: float | None = None
        self.restore_s: float | None = None

    @property
    def capacity_bytes(self) -> int:
        """Bytes of keys and values its slots hold."""
        return self.slots * self.bytes_per_token

    @property
    def restores(self) -> bool:
        """Whether copying runs back is faster than computing them again, as timed end to end on this machine
        and pool (true until timed)."""
        return self.restore_s is None or self.recompute_s is None or self.restore_s < self.recompute_s

    @property
    def copy_cost(self) -> float:
        """What copying a token back costs, as a share of computing it (timed at warm-up; 0 until timed)."""
        if self.restore_s is None or self.recompute_s is None:
            return 0.0
        return min(1.0, self.restore_s / self.recompute_s)

    def take(self, count: int) -> HostRun | None:
        """`count` free slots, in one extent where one is long enough; None: fewer are free."""
        if count > self.slots - self.used:
            return None
        for i, (start, length) in enumerate(self._free):
            if length >= count:
                self._free[i:i + 1] = [(start + count, length - count)] if length > count else []
                self.used += count
                return HostRun([(start, count)], tier=self)
        extents, left = [], count
        while left:
            start, length = self._free[0]
            used = min(length, left)
            self._free[0:1] = [(start + used, length - used)] if length > used else []
            extents.append((start, used))
            left -= used
        self.used += count
        return HostRun(extents, tier=self)

    def free(self, run: HostRun) -> None:
        """Give the run's slots back."""
        for start, count in run.extents:
            i = bisect.bisect_left(self._free, (start, count))
            if i < len(self._free) and start + count == self._free[i][0]:
                count += self._free.pop(i)[1]
            if i and self._free[i - 1][0] + self._free[i - 1][1] == start:
                start, count = self._free[i - 1][0], self._free[i - 1][1] + count
                self._free.pop(i - 1)
                i -= 1
            self._free.insert(i, (start, count))
        self.used -= len(run)

    def move(self, run: HostRun, to: "HostTier") -> HostRun | None:
        """The run copied into the store of tier `to` (the disk tier), its slots here given back; None (and it
        stays here) when `to` has no room. Copies back still owed must have been made (`settle`)."""
        home = to.take(len(run))
        if home is None:
            return None
        if run.copied is not None:
            run.copied.synchronize()  # its copy out of the pool has been made
        data = torch.cat([self.store[start:start + count] for start, count in run.extents])
        offset = 0
        for start, count in home.extents:
            to.store[start:start + count].copy_(data[offset:offset + count])
            offset += count
        self.free(run)
        return home

    def offload(self, runs: list[KV]) -> list[HostRun | None]:
        """Copy these runs of the pool into host slots, in groups of at most STAGE_BYTES of KV (one gather per
        layer each: the device stages a group, never all of a large eviction at once); None for a run there
        is no room for. The pool's slots may be freed at once: the gathers read them before any later pass
        writes there."""
        per_slot = self.store[0].numel() * self.store.element_size()
        homes, group, size = [], [], 0
        for kv in runs:
            if group and (size + len(kv)) * per_slot > STAGE_BYTES:
                homes += self._offload_group(group)
                group, size = [], 0
            group.append(kv)
            size += len(kv)
        return homes + (self._offload_group(group) if group else [])

    def _offload_group(self, runs: list[KV]) -> list[HostRun | None]:
        homes = [self.take(len(kv)) for kv in runs]
        moved = [kv for kv, home in zip(runs, homes) if home is not None]
        if not moved:
            return homes
        index = on_device(self.pool.device, np.concatenate([slots for kv in moved for _, slots in kv.parts]))
        staged = torch.empty((len(index),) + tuple(self.store.shape[1:]), dtype=self.store.dtype,
                             device=self.pool.device)
        for layer in range(len(self.pool.keys)):
            staged[:, 0, layer] = self.pool.keys[layer].index_select(0, index)
            staged[:, 1, layer] = self.pool.values[layer].index_select(0, index)
        extents = [extent for home in homes if home is not None for extent in home.extents]
        self._pin(extents)
        if self.out is None:
            self._copy_out(staged, extents)
            return homes
        self.out.wait_stream(torch.cuda.current_stream(self.pool.device))  # the gather
        self.out.wait_stream(self.back)  # copies back still reading host slots given back since
        with torch.cuda.stream(self.out):
            self._copy_out(staged, extents)
            copied = torch.cuda.Event()
            copied.record()
        staged.record_stream(self.out)
        for home in homes:
            if home is not None:
                home.copied = copied
        return homes

    def _pin(self, extents: list[tuple[int, int]]) -> None:
        """Pin the chunks of the store these extents lie in that are not pinned yet (on a GPU)."""
        if self._pinned is None:
            return
        size = self._chunk_slots
        for start, count in extents:
            for chunk in range(start // size, (start + count - 1) // size + 1):
                self.pin_chunk(chunk)

    def pin_chunk(self, chunk: int) -> None:
        """Pin chunk number `chunk` of the store, unless it is already."""
        with self._pinned.lock:
            if not self._pinned.closed and chunk not in self._pinned.chunks:
                piece = self.store[chunk * self._chunk_slots:(chunk + 1) * self._chunk_slots]
                error = torch.cuda.cudart().cudaHostRegister(piece.data_ptr(), piece.nbytes, 0)
                if int(error) != 0:
                    raise RuntimeError(f"pinning {piece.nbytes:,} bytes of host memory failed ({error})")
                self._pinned.chunks.add(chunk)

    def _copy_out(self, staged: torch.Tensor, extents: list[tuple[int, int]]) -> None:
        offset = 0
        for start, count in self._within_chunks(extents):
            self.store[start:start + count].copy_(staged[offset:offset + count], non_blocking=True)
            offset += count

    def _within_chunks(self, extents: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The extents cut where they cross from one pinned chunk into the next: CUDA copies to and from
        registered host memory only within one registration."""
        size, out = self._chunk_slots, []
        for start, count in extents:
            while count:
                piece = min(count, size - start % size)
                out.append((start, piece))
                start, count = start + piece, count - piece
        return out

    def restore(self, run: HostRun) -> KV:
        """A device run for these host tokens, in pool slots (in a pool of its own when the pool's are all
        held: a copy for the caller, the host keeps the run); the copy is owed until `settle`, which every
        pass calls before it reads the pool. The host slots of a run back in the pool are given back then."""
        pool, slots = self.pool, self.pool.take(len(run))
        if slots is None:
            pool = KVPool.like(self.pool, len(run))
            slots = pool.take(len(run))
        kv = KV(((pool, slots),))
        self._owed.append(_Restore(run, kv))
        return kv

    def settle(self) -> None:
        """Queue the owed copies back: one copy per host extent, then one scatter per layer into the pool."""
        if not self._owed:
            return
        owed, self._owed = self._owed, []
        pieces = [self.store[start:start + count]
                  for entry in owed for start, count in self._within_chunks(entry.run.extents)]
        if self.back is None:
            staged = torch.cat(pieces)
        else:
            for copied in {id(e.run.copied): e.run.copied for e in owed if e.run.copied is not None}.values():
                self.back.wait_event(copied)
            with torch.cuda.stream(self.back):
                staged = torch.cat([piece.to(self.pool.device, non_blocking=True) for piece in pieces])
            main = torch.cuda.current_stream(self.pool.device)
            main.wait_stream(self.back)
            staged.record_stream(main)
        into: dict[int, tuple[KVPool, list[np.ndarray], list[int]]] = {}  # per pool: slots, rows of `staged`
        offset = 0
        for entry in owed:
            pool, slots = entry.kv.parts[0]
            _, targets, rows = into.setdefault(id(pool), (pool, [], []))
            targets.append(slots)
            rows.extend(range(offset, offset + len(slots)))
            offset += len(slots)
        for pool, targets, rows in into.values():
            part = staged if len(into) == 1 else staged[on_device(pool.device, np.array(rows))]
            slots = on_device(pool.device, np.concatenate(targets))
            for layer in range(len(pool.keys)):
                pool.write(layer, slots, part[:, 0, layer], part[:, 1, layer])
        for entry in owed:
            if entry.kv.parts[0][0] is self.pool:
                self.free(entry.run)


def _pin_ahead(tier: "weakref.ref[HostTier]", chunks: int, device: int) -> None:
    """Pin a host tier's chunks one after another, first slots first (as runs fill it), until all are pinned or
    the tier is gone or unpinned (its pool on GPU number `device`)."""
    torch.cuda.set_device(device)
    for chunk in range(chunks):
        held = tier()
        if held is None or held._pinned.closed:
            return
        held.pin_chunk(chunk)
        del held


@dataclass
class _Pinned:
    """A store's chunks registered with CUDA (pinned), under one lock; `closed` once they are unregistered."""
    chunks: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False


def _unpin(store: torch.Tensor, pinned: _Pinned, chunk_slots: int) -> None:
    """Unregister a store's pinned chunks (before its memory goes back, or at the interpreter's exit) and pin no
    more: the pinning thread may still be running then, and waits on the lock, then stops."""
    with pinned.lock:
        pinned.closed = True
        for chunk in pinned.chunks:
            torch.cuda.cudart().cudaHostUnregister(store[chunk * chunk_slots].data_ptr())
        pinned.chunks.clear()


def default_host_bytes(device: torch.device, replicas: int = 1) -> int:
    """The host tier a pool on `device` gets by default: none on the CPU (its pool is in host memory already);
    on a GPU, HOST_SHARE of the memory the host has available now, shared by the `replicas` of this host."""
    if device.type != "cuda":
        return 0
    return int(HOST_SHARE * available_host_bytes()) // max(1, replicas)


def default_disk_bytes(directory: Path, replicas: int = 1) -> int:
    """The disk tier a directory gives by default: half its disk's free space now, shared by the `replicas`
    of this host."""
    return shutil.disk_usage(directory).free // 2 // max(1, replicas)


def available_host_bytes() -> int:
    """Host memory this process may still take: Linux's MemAvailable (else the free pages), and no more than its
    container's memory limit leaves (cgroup v2 or v1), so a tier sized from it fits the container."""
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    meminfo = _read("/proc/meminfo")
    for line in (meminfo or "").splitlines():
        if line.startswith("MemAvailable:"):
            available = int(line.split()[1]) * 1024
    for limit, usage in CGROUP_MEMORY:
        allowed, used = _read(limit), _read(usage)
        if allowed is not None and used is not None and allowed.strip().isdigit():
            available = min(available, max(0, int(allowed) - int(used)))
    return available


def _read(path: str) -> str | None:
    """A small file's text (None: it cannot be read)."""
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return None


def _page_aligned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized tensor whose memory starts at a page boundary (so chunks of whole pages can be pinned
    one by one)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    raw = torch.empty(nbytes + PAGE, dtype=torch.uint8)
    offset = -raw.data_ptr() % PAGE
    return raw[offset:offset + nbytes].view(dtype).view(shape)


def _in_file(shape: tuple[int, ...], dtype: torch.dtype, path: Path) -> torch.Tensor:
    """An uninitialized tensor mapped from a new sparse file at `path`, unlinked at once (the mapping keeps it
    until the tensor goes: nothing is left on the disk, whatever ends the process)."""
    count = math.prod(shape)
    with open(path, "xb") as file:
        file.truncate(count * torch.empty((), dtype=dtype).element_size())
    try:
        return torch.from_file(str(path), shared=True, size=count, dtype=dtype).view(shape)
    finally:
        path.unlink()
