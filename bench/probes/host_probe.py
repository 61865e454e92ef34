"""GPU probe: where the host spends a query's time (H200) — the CUDA runtime calls that wait for the GPU.

Runs a query once to warm up, then again under torch.profiler (CPU and CUDA):
writes the operators and CUDA runtime calls (cudaStreamSynchronize,
cudaHostAlloc, cudaMemcpyAsync, ...) by host time, the GPU's kernel time, and
the wall time, to --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import quail
from bench.datagen import Workload, generate
from bench.run import corpora_for, query_text, run_query, warm_up


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--query", default="F1")
    p.add_argument("--scale", type=float, default=0.02)
    p.add_argument("--tokenizer", default=".carry/tokenizer")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    config = quail.EngineConfig(model="dummy:qwen3-4b", device="cuda", precision="bf16", token_budget=16384,
                                decisions="hash", tokenizer=args.tokenizer, sol_device="h200")
    session = quail.Session(config)
    warm_up(session.runtime)
    for name, table in generate(Workload(args.scale, 0, 1.0), corpora_for([args.query])).items():
        session.register(name, table)
    run_query(session, query_text(args.query))
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    start = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        _, report = run_query(session, query_text(args.query))
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    events = prof.key_averages()
    host = sorted(events, key=lambda e: -e.self_cpu_time_total)[:40]
    result = {
        "query": args.query, "scale": args.scale, "wall_s": wall, "report_wall_s": report.wall_s,
        "forward_passes": report.forward_passes,
        "kernels_s": sum(e.self_device_time_total for e in events) / 1e6,
        "host_self_s": [(e.key[:80], e.count, round(e.self_cpu_time_total / 1e6, 4)) for e in host],
        "cuda_runtime_s": [(e.key, e.count, round(e.self_cpu_time_total / 1e6, 4)) for e in events
                           if e.key.startswith("cuda")],
    }
    print(json.dumps({k: v for k, v in result.items() if k != "host_self_s"}, indent=1))
    print(json.dumps(result["host_self_s"][:15], indent=1))
    Path(args.out, f"host-{args.query}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
