"""GPU probe: many small AI statements at once against one statement over the same rows (in-process).

Through the public Python API only (so any version's wheel runs it), with
dummy weights and hash decisions:
- `one`: one statement over clients × rows rows (the reference);
- `together`: `clients` threads at once, each a statement over its own `rows` rows;
- `in_turn`: the same statements one after another from one thread;
each with its wall seconds, fresh tokens per second, the device's busy seconds
(where the runtime counts them) and fresh tokens per busy second, and
`together`'s per-statement latencies; with --kernels, each kernel's milliseconds
in `one` and in `together` (torch.profiler, run again over new rows). Every
statement's rows are new to the prefix cache (each phase reads rows the others
do not). Writes concurrent.json to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

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
    busy = getattr(session.runtime.runner.scheduler, "busy", None)
    return None if busy is None else busy.seconds()


def measured(session: quail.Session, run) -> tuple[float, float | None, object]:
    """`run()`'s wall seconds, the device's busy seconds in it, and what it returned."""
    before, started = busy_seconds(session), time.perf_counter()
    out = run()
    wall, after = time.perf_counter() - started, busy_seconds(session)
    return wall, None if before is None else after - before, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    add_engine_arguments(p)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rows", type=int, default=20)
    p.add_argument("--tag", default="")
    p.add_argument("--kernels", action="store_true", help="profile `one` and `together` again, kernel by kernel")
    p.add_argument("--switch-interval", type=float, default=None,
                   help="the interpreter's thread switch interval, seconds (sys.setswitchinterval; default 0.005)")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    block = args.clients * args.rows
    session = quail.Session(engine_config(args))
    session.register("reviews", numbered_reviews((7 if args.kernels else 5) * block, 300))
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
    print(json.dumps(result, indent=1))
    Path(args.out, f"concurrent{args.tag}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
