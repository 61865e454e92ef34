"""GPU probe: why a query's first run is slower than its second (H200).

Times cuDNN attention's first call on a new shape against a warm call, then runs
queries twice in one process, with attention's bucket shapes rounded (as
shipped) or exact (`--exact-shapes`). Writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import quail
import quail.engine.attention as attention
from quail.engine.attention import attend

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
    p.add_argument("--tokenizer", default=".carry/tokenizer")
    p.add_argument("--exact-shapes", action="store_true")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--out", default=".")
    args = p.parse_args()
    if args.exact_shapes:
        attention.padded_shape = lambda rows, width: (rows, width)
    result: dict = {"exact_shapes": args.exact_shapes,
                    "first_calls": first_calls([(40 + i, 300 + 7 * i) for i in range(8)])}
    queries = args.queries.split(",")
    tables = generate(Workload(args.scale, 0, 1.0), corpora_for(queries))
    config = quail.EngineConfig(model="dummy:qwen3-4b", device="cuda", precision="bf16", token_budget=16384,
                                decisions="hash", tokenizer=args.tokenizer, sol_device="h200")
    session = quail.Session(config)
    runner = session.runtime.runner
    passes: list[dict] = []
    forward = runner.forward

    def timed(rows, stats):  # each pass on its own: milliseconds and the attention buckets it ran
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = forward(rows, stats)
        torch.cuda.synchronize()
        lengths = [len(r.ids) for r in rows]
        passes.append({"ms": 1000 * (time.perf_counter() - start), "tokens": sum(lengths),
                       "buckets": [(r, w) for _, r, w in attention.Rows.build(lengths, [r.past for r in rows],
                                                                            torch.device("cpu")).buckets]})
        return out

    runner.forward = timed
    warm_up(session.runtime)
    for name, table in tables.items():
        session.register(name, table)
    for query in queries:
        runs = []
        for _ in range(args.runs):
            passes.clear()
            _, report = run_query(session, query_text(query))
            runs.append({"wall_s": report.wall_s, "sol_fraction": report.sol_fraction,
                         "forward_passes": report.forward_passes, "passes": list(passes)})
            slow = sorted(passes, key=lambda x: -x["ms"])[:5]
            print(query, report.wall_s, "slowest passes:", slow, flush=True)
        result[query] = runs
    tag = "exact" if args.exact_shapes else "rounded"
    Path(args.out, f"first-run-{tag}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
