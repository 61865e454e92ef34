"""Time single forward passes of the runner on pass shapes of the benchmark, with a kernel profile (GPU).

    python -m bench.profile_pass --model dummy:qwen3-4b --tokenizer DIR --out DIR

Shapes: `filter` (44 rows of 370 new tokens, no resident KV), `short` (128 rows of 128: an embedding
model's texts, bench/embedding_speed.py's), `filter-mixed`
(rows of lognormal lengths around 330 tokens up to 16,384: F1's passes),
`join` (90 resident runs of 300 tokens, 12 rows of 15 tokens after each: J1's),
`anchor` (one 2,500-token run, 300 rows of 12 tokens after it: BIG's). For each
precision and attention layout (compiled): milliseconds per pass, new tokens per
second, the time the pass's GEMMs alone take (the floor of the linear layers),
and the kernels' total time (below the pass's milliseconds: the GPU waited for the host).
Writes profile-<model>.json with the top kernels of each pass.
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

import numpy as np
import torch

from quail.engine.kv.runs import KV
from quail.engine.model.config import EngineConfig
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.loading import load_runtime
from quail.engine.runtime.packing import Row

VARIANTS = [("bf16", True, "buckets"), ("bf16", True, "varlen"), ("fp8", True, "varlen")]


def shapes(cfg, device) -> dict[str, list[Row]]:
    rng = np.random.default_rng(0)

    def ids(n: int) -> np.ndarray:
        return rng.integers(0, 1000, n).astype(np.int32)

    def run(c: int) -> KV:
        return KV.of([torch.randn(c, cfg.num_kv_heads, cfg.head_dim, device=device, dtype=torch.bfloat16)
                   for _ in range(cfg.num_layers)],
                  [torch.randn(c, cfg.num_kv_heads, cfg.head_dim, device=device, dtype=torch.bfloat16)
                   for _ in range(cfg.num_layers)])

    joins = [run(300) for _ in range(90)]
    anchor = run(2500)
    mixed = np.maximum(8, rng.lognormal(np.log(330) - 0.08, 0.4, 60).astype(int))
    mixed = mixed[np.cumsum(mixed) <= 16384]
    return {"filter": [Row(ids(370)) for _ in range(44)], "short": [Row(ids(128)) for _ in range(128)],
            "filter-mixed": [Row(ids(n)) for n in mixed],
            "join": [Row(ids(15), kv) for kv in joins for _ in range(12)],
            "anchor": [Row(ids(12), anchor) for _ in range(300)]}


def timed(fn, repeat: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def gemm_floor(cfg, tokens: int, device: str) -> float:
    """Milliseconds of the pass's bf16 GEMMs alone (every layer's seven projections)."""
    h, i, qd, kvd = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    x = torch.randn(tokens, max(h, i, qd), device=device, dtype=torch.bfloat16)
    weights = [torch.randn(o, k, device=device, dtype=torch.bfloat16) for k, o in
               [(h, qd), (h, kvd), (h, kvd), (qd, h), (h, i), (h, i), (i, h)]]
    return cfg.num_layers * timed(lambda: [x[:, : w.shape[1]] @ w.T for w in weights])


def top_kernels(fn, count: int = 15) -> tuple[float, list[tuple[str, float]]]:
    """Milliseconds of all the pass's kernels together, and of the `count` largest."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in events) / 1e3
    return total, [(e.key[:90], round(e.device_time_total / 1e3, 3)) for e in events[:count]]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile_pass", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="dummy:qwen3-4b")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--out", default=".")
    args = p.parse_args(argv)
    result: dict = {"model": args.model, "device": torch.cuda.get_device_name(0), "passes": {}}
    for precision, compiled, attention in VARIANTS:
        runtime = load_runtime(EngineConfig(model=args.model, device="cuda", precision=precision,
                                            tokenizer=args.tokenizer, compile=compiled, attention=attention))
        cfg = runtime.config
        for name, rows in shapes(cfg, "cuda").items():
            tokens = sum(len(r.ids) for r in rows)
            ms = timed(lambda: runtime.runner.forward(rows, Stats()))
            entry = {"tokens": tokens, "ms": ms, "tokens_per_s": tokens / ms * 1e3}
            if precision == "bf16":
                entry["gemm_floor_ms"] = gemm_floor(cfg, tokens, "cuda")
            if compiled:
                entry["kernels_total_ms"], entry["kernels_ms"] = top_kernels(
                    lambda: runtime.runner.forward(rows, Stats()))
            result["passes"][f"{name}-{precision}{'-compiled' if compiled else ''}-{attention}"] = entry
            print(name, precision, compiled, {k: v for k, v in entry.items() if k != "kernels_ms"}, flush=True)
        runtime = None  # free the weights before the next variant loads
        gc.collect()
        torch.cuda.empty_cache()
    path = Path(args.out) / f"profile-{args.model.removeprefix('dummy:')}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
