"""CUDA-event timing shared by the probes, a sweep of a kernel's launch settings, and the kernel probes' command line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
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


def sweep(name: str, blocks: list[tuple[int, int]], call: Callable[[int, int], object], moved: int,
          error: Callable[[object], float]) -> list[dict]:
    """A memory-bound kernel over its launch settings: for each (block, warps), `call(block, warps)`'s
    milliseconds, its bandwidth (`moved` bytes a call) and `error(its output)`; the block named `name`."""
    out = []
    for block, warps in blocks:
        ms = timed_ms(lambda: call(block, warps))
        out.append({name: block, "warps": warps, "ms": ms, "tb_per_s": moved / ms / 1e9,
                    "error": error(call(block, warps))})
    return out


def shapes_probe(prog: str, description: str, tokens: int, file: str, shapes: dict[str, Callable[[], dict]],
                 argv: list[str] | None = None) -> None:
    """A probe's command line (`--out DIR`): each shape's figures, beside the device, torch and the token
    count, written to DIR/`file` as JSON."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--out", default=".")
    args = p.parse_args(argv)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "tokens": tokens,
              "shapes": {name: probe() for name, probe in shapes.items()}}
    (Path(args.out) / file).write_text(json.dumps(result, indent=1) + "\n")
