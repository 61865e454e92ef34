"""GPU probe: the host's microseconds to put a small index array on the device, pinned first or not.

A pass's layout puts about ten small int32/int64 arrays (a few to a few
thousand entries) on the device, in one copy (engine/kv/pool.on_device_all;
up to ~1 MB for a pass of 16,384 tokens). For each size, the
host time per call of: pinning a copy then a non-blocking copy (on_device as
it is), a non-blocking copy straight from the array's pageable memory, and a
blocking copy; each timed with the device idle and again behind ~50 ms of
queued matmuls, to see which waits for the queued work. Every copy is checked
to land the same values. Writes upload.json to --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

SIZES = (16, 256, 6_656, 65_536, 262_144, 1_048_576)
REPEATS = 200
WAYS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "pinned, non-blocking": lambda host: host.pin_memory().to("cuda", non_blocking=True),
    "pageable, non-blocking": lambda host: host.to("cuda", non_blocking=True),
    "pageable, blocking": lambda host: host.to("cuda"),
}


def busy(ms: float = 50.0) -> None:
    """Queue about `ms` milliseconds of matmuls on the current stream (not waited for)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(max(1, int(ms / 1.5))):  # ~1.4 ms a 8192³ bf16 matmul on an H200
        a @ a


def host_us(way: Callable[[torch.Tensor], torch.Tensor], array: np.ndarray, queued: bool) -> dict[str, float]:
    """Median host microseconds of one call (and whether the values landed), idle or behind queued work."""
    times = []
    for _ in range(REPEATS if not queued else 5):
        if queued:
            busy()
        started = time.perf_counter()
        out = way(torch.from_numpy(array))
        times.append(time.perf_counter() - started)
        if queued:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), torch.from_numpy(array))
    return {"host_us": round(1e6 * float(np.median(times)), 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".")
    p.add_argument("--tag", default="")
    args = p.parse_args()
    busy(5)
    torch.cuda.synchronize()
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "sizes": {}}
    for size in SIZES:
        array = np.random.default_rng(size).integers(0, 1 << 30, size, dtype=np.int64)
        result["sizes"][size] = {name: {"idle": host_us(way, array, False), "behind_queued_work":
                                        host_us(way, array, True)} for name, way in WAYS.items()}
    text = json.dumps(result, indent=1)
    print(text)
    Path(args.out, f"upload{args.tag}.json").write_text(text)


if __name__ == "__main__":
    main()
