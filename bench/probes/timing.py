"""CUDA-event timing shared by the probes."""

from __future__ import annotations

from typing import Callable

import torch


def timed_ms(fn: Callable[[], object], repeats: int = 20) -> float:
    """Mean milliseconds of `fn` over `repeats` calls back to back, after three warm-up calls."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats
