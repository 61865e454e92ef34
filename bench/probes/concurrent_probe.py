"""GPU probe: many small AI statements at once against one statement over the same rows (in-process).

Through the public Python API only (so any version's wheel runs it), with
dummy weights and hash decisions:
- `one`: one statement over clients × rows rows (the reference);
- `together`: `clients` threads at once, each a statement over its own `rows` rows;
- `in_turn`: the same statements one after another from one thread;
each with its wall seconds, fresh tokens per second, the device's busy seconds
(where the runtime counts them) and fresh tokens per busy second, and
`together`'s per-statement latencies; with --kernels, each kernel's milliseconds
in `one` and in `together` (torch.profiler, run again over new rows); with
--gaps, where the device waited between kernels in `one` and in `together` (run
again over new rows, only the device's activity traced): the idle time in gaps
of each size, and by the kernel each gap ended with (the launch that came late). Every
statement's rows are new to the prefix cache (each phase reads rows the others
do not). Writes concurrent.json to --out.
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import torch

import quail
from bench.datagen import numbered_reviews
from bench.probes.engine_args import add_engine_arguments, engine_config
from bench.profile_pass import top_kernels

QUESTION = "Does the review {0} complain about the service?"


def statement(first: int, rows: int) -> str:
    return (f"SELECT id FROM reviews WHERE id BETWEEN {first} AND {first + rows - 1} "
            f"AND AI_FILTER(PROMPT('{QUESTION}', body))")


def timed(session: quail.Session, query: str) -> tuple[float, int]:
    started = time.perf_counter()
    report = session.sql(query).run().report
    return time.perf_counter() - started, report.fresh_tokens


def phase(seconds: float, fresh: int, busy_s: float | None = None) -> dict:
    busy = {} if busy_s is None else {"busy_s": round(busy_s, 3), "fresh_tokens_per_busy_s": round(fresh / busy_s)}
    return {"wall_s": round(seconds, 3), "fresh_tokens": fresh, "fresh_tokens_per_s": round(fresh / seconds), **busy}


def busy_seconds(session: quail.Session) -> float | None:
    """The device's busy seconds so far, where the runtime counts them."""
    busy = getattr(session.runtime.scheduler, "busy", None)
    return None if busy is None else busy.seconds()


def measured(session: quail.Session, run) -> tuple[float, float | None, object]:
    """`run()`'s wall seconds, the device's busy seconds in it, and what it returned."""
    before, started = busy_seconds(session), time.perf_counter()
    out = run()
    wall, after = time.perf_counter() - started, busy_seconds(session)
    return wall, None if before is None else after - before, out


GAP_EDGES_MS = (0.01, 0.05, 0.2, 1.0, 5.0)  # gap sizes reported apart (`gaps`)


def gaps(run) -> dict:
    """Where the device waited while `run()` ran: its kernels' busy and idle milliseconds between the first
    kernel's start and the last's end, the idle split by gap size (GAP_EDGES_MS) and by the kernel ending
    the gap (the 12 that ended the most idle time), and the 12 longest gaps (when, from the first kernel's
    start, how long, and the kernel ending each)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    if not kernels:
        return {}
    sizes: Counter[str] = Counter()
    after: Counter[str] = Counter()
    found: list[tuple[float, float, str]] = []  # each gap: its length, when it began, the kernel ending it
    busy, end = 0.0, kernels[0][0]
    for start, stop, name in kernels:
        idle = (start - end) / 1e3
        if idle > 0:
            edge = next((f"<{e}" for e in GAP_EDGES_MS if idle < e), f">={GAP_EDGES_MS[-1]}")
            sizes[edge] += idle
            after[name[:80]] += idle
            found.append((idle, (end - kernels[0][0]) / 1e3, name[:80]))
        busy += (stop - max(start, end)) / 1e3 if stop > end else 0.0
        end = max(end, stop)
    span = (end - kernels[0][0]) / 1e3
    return {"span_ms": round(span, 1), "busy_ms": round(busy, 1), "idle_ms": round(span - busy, 1),
            "idle_by_gap_ms": {k: round(v, 1) for k, v in sorted(sizes.items())},
            "idle_before_ms": [(k, round(v, 1)) for k, v in after.most_common(12)],
            "longest_gaps_ms": [(round(at, 1), round(idle, 1), name) for idle, at, name in heapq.nlargest(12, found)]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    add_engine_arguments(p)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rows", type=int, default=20)
    p.add_argument("--tag", default="")
    p.add_argument("--kernels", action="store_true", help="profile `one` and `together` again, kernel by kernel")
    p.add_argument("--gaps", action="store_true", help="trace `one` and `together` again: where the device waited")
    p.add_argument("--switch-interval", type=float, default=None,
                   help="the interpreter's thread switch interval, seconds (sys.setswitchinterval; default 0.005)")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    block = args.clients * args.rows
    session = quail.Session(engine_config(args))
    session.register("reviews", numbered_reviews((5 + 2 * args.kernels + 2 * args.gaps) * block, 300))
    session.runtime.warm_up()
    timed(session, statement(4 * block, block))  # first runs of this shape: compiled layers, kernels

    def together(first: int) -> tuple[list[float], list[int]]:
        latencies: list[float] = []
        totals: list[int] = []
        lock = threading.Lock()

        def client(k: int) -> None:
            seconds, tokens = timed(session, statement(first + k * args.rows, args.rows))
            with lock:
                latencies.append(seconds)
                totals.append(tokens)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return latencies, totals

    wall, busy, (_, fresh) = measured(session, lambda: timed(session, statement(0, block)))
    result = {"clients": args.clients, "rows": args.rows, "switch_interval_s": sys.getswitchinterval(),
              "one": phase(wall, fresh, busy)}
    wall, busy, (latencies, totals) = measured(session, lambda: together(block))
    result["together"] = {**phase(wall, sum(totals), busy), "latency_p50_s": round(statistics.median(latencies), 3),
                          "latency_max_s": round(max(latencies), 3)}
    wall, busy, fresh = measured(session, lambda: sum(timed(session, statement(2 * block + k * args.rows, args.rows))[1]
                                                      for k in range(args.clients)))
    result["in_turn"] = phase(wall, fresh, busy)
    for name in ("together", "in_turn"):
        result[name]["against_one"] = round(result[name]["fresh_tokens_per_s"]
                                            / result["one"]["fresh_tokens_per_s"], 3)
    if args.kernels:
        result["kernels_ms"] = {"one": top_kernels(lambda: timed(session, statement(5 * block, block)), 25),
                                "together": top_kernels(lambda: together(6 * block), 25)}
    if args.gaps:
        first = (5 + 2 * args.kernels) * block
        result["gaps"] = {"one": gaps(lambda: timed(session, statement(first, block))),
                          "together": gaps(lambda: together(first + block))}
    print(json.dumps(result, indent=1))
    Path(args.out, f"concurrent{args.tag}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
