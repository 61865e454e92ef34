"""GPU probe: why a query's first run is slower than its second (H200).

Times cuDNN attention's first call on a new shape against a warm call, then runs
queries twice in one process, with attention's bucket shapes rounded (as
shipped) or exact (`--exact-shapes`), or with own-token attention in one
varlen call (`--attention varlen`, the default on CUDA), with or without the
documents' cache (`--kv-cache-bytes`). Each pass is timed by CUDA events (its
GPU span, the GPU's idle gap before the next pass, and before the first: the
host work a query does before its first pass) without a sync. Writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import quail
from quail.engine.kernels.attention import attend
import quail.engine.kernels.attention as attention
from quail.engine.model.config import ATTENTION
from quail.engine.runtime.model_runner import ModelRunner

from bench.datagen import Workload, generate
from bench.run import corpora_for, query_text, run_query, warm_up


def first_calls(shapes: list[tuple[int, int]]) -> list[dict]:
    """Milliseconds of the first and of a warm cuDNN call per (rows, width) shape."""
    out = []
    for rows, width in shapes:
        q = torch.randn(rows, 32, width, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(rows, 8, width, 128, device="cuda", dtype=torch.bfloat16)
        times = []
        for _ in range(2):
            torch.cuda.synchronize()
            start = time.perf_counter()
            attend(q, k, k, causal=True)
            torch.cuda.synchronize()
            times.append(1000 * (time.perf_counter() - start))
        out.append({"rows": rows, "width": width, "first_ms": times[0], "warm_ms": times[1]})
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--queries", default="F1,J1")
    p.add_argument("--scale", type=float, default=0.1)
    p.add_argument("--tokenizer", default=".offline/tokenizer")
    p.add_argument("--exact-shapes", action="store_true")
    p.add_argument("--attention", default=None, choices=ATTENTION)
    p.add_argument("--kv-cache-bytes", type=int, default=None)
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp8"])
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--out", default=".")
    args = p.parse_args()
    if args.exact_shapes:
        attention.padded_shape = lambda rows, width: (rows, width)
    result: dict = {"exact_shapes": args.exact_shapes, "attention": args.attention, "precision": args.precision,
                    "kv_cache_bytes": args.kv_cache_bytes,
                    "first_calls": first_calls([(40 + i, 300 + 7 * i) for i in range(8)])}
    queries = args.queries.split(",")
    tables = generate(Workload(args.scale, 0, 1.0), corpora_for(queries))
    config = quail.EngineConfig(model="dummy:qwen3-4b", device="cuda", precision=args.precision, token_budget=16384,
                                decisions="hash", tokenizer=args.tokenizer, sol_device="h200",
                                attention=args.attention, kv_cache_bytes=args.kv_cache_bytes)
    session = quail.Session(config)
    passes: list[dict] = []
    passing = ModelRunner.passing

    def timed(runner, groups, *rest):  # CUDA events around each pass: its GPU span, without a sync
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        host = time.perf_counter()
        start.record()
        out = yield from passing(runner, groups, *rest)
        rows = [row for owned, _ in groups for row in owned]
        end.record()
        passes.append({"start": start, "end": end, "host_ms": 1000 * (time.perf_counter() - host),
                       "tokens": sum(len(r.ids) for r in rows), "rows": len(rows)})
        return out

    ModelRunner.passing = timed
    warm_up(session.runtime)
    for name, table in tables.items():
        session.register(name, table)
    for query in queries:
        runs = []
        for _ in range(args.runs):
            passes.clear()
            if session.runtime.runner.tree is not None:
                session.runtime.runner.tree.clear()
            begun = torch.cuda.Event(enable_timing=True)
            begun.record()
            _, report = run_query(session, query_text(query))
            torch.cuda.synchronize()
            spans = [{"gpu_ms": x["start"].elapsed_time(x["end"]), "host_ms": x["host_ms"], "tokens": x["tokens"],
                      "rows": x["rows"]} for x in passes]
            gaps = [a["end"].elapsed_time(b["start"]) for a, b in zip(passes, passes[1:])]
            summary = {"wall_s": report.wall_s, "sol_fraction": report.sol_fraction,
                       "forward_passes": report.forward_passes, "pass_gpu_s": sum(x["gpu_ms"] for x in spans) / 1000,
                       "host_in_forward_s": sum(x["host_ms"] for x in spans) / 1000,
                       "gaps_between_passes_s": sum(gaps) / 1000, "fresh_tokens": sum(x["tokens"] for x in spans),
                       "before_first_pass_s": begun.elapsed_time(passes[0]["start"]) / 1000 if passes else None}
            print(query, summary, flush=True)
            runs.append({**summary, "passes": spans, "gaps_ms": gaps})
        result[query] = runs
    tag = ("exact" if args.exact_shapes else "rounded") if args.attention == "buckets" else "varlen"
    tag += "-cache" if args.kv_cache_bytes else ""
    Path(args.out, f"first-run-{tag}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
