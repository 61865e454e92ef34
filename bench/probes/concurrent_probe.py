"""GPU probe: many small AI statements at once against one statement over the same rows (in-process).

Through the public Python API only (so any version's wheel runs it), with
dummy weights and hash decisions:
- `one`: one statement over clients × rows rows (the reference);
- `together`: `clients` threads at once, each a statement over its own `rows` rows;
- `in_turn`: the same statements one after another from one thread;
each with its wall seconds and fresh tokens per second, and `together`'s
per-statement latencies. Every statement's rows are new to the prefix cache
(each phase reads rows the others do not). Writes concurrent.json to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import quail
from bench.datagen import numbered_reviews
from bench.probes.engine_args import add_engine_arguments, engine_config

QUESTION = "Does the review {0} complain about the service?"


def statement(first: int, rows: int) -> str:
    return (f"SELECT id FROM reviews WHERE id BETWEEN {first} AND {first + rows - 1} "
            f"AND AI_FILTER(PROMPT('{QUESTION}', body))")


def timed(session: quail.Session, query: str) -> tuple[float, int]:
    started = time.perf_counter()
    report = session.sql(query).run().report
    return time.perf_counter() - started, report.fresh_tokens


def phase(seconds: float, fresh: int) -> dict:
    return {"wall_s": round(seconds, 3), "fresh_tokens": fresh, "fresh_tokens_per_s": round(fresh / seconds)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    add_engine_arguments(p)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rows", type=int, default=20)
    p.add_argument("--tag", default="")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    block = args.clients * args.rows
    session = quail.Session(engine_config(args))
    session.register("reviews", numbered_reviews(5 * block, 300))
    session.runtime.warm_up()
    timed(session, statement(4 * block, block))  # first runs of this shape: compiled layers, kernels
    wall, fresh = timed(session, statement(0, block))
    result = {"clients": args.clients, "rows": args.rows, "one": phase(wall, fresh)}

    latencies: list[float] = []
    totals: list[int] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        seconds, tokens = timed(session, statement(block + k * args.rows, args.rows))
        with lock:
            latencies.append(seconds)
            totals.append(tokens)

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result["together"] = {**phase(time.perf_counter() - started, sum(totals)),
                          "latency_p50_s": round(statistics.median(latencies), 3),
                          "latency_max_s": round(max(latencies), 3)}
    started, fresh = time.perf_counter(), 0
    for k in range(args.clients):
        fresh += timed(session, statement(2 * block + k * args.rows, args.rows))[1]
    result["in_turn"] = phase(time.perf_counter() - started, fresh)
    for name in ("together", "in_turn"):
        result[name]["against_one"] = round(result[name]["fresh_tokens_per_s"]
                                            / result["one"]["fresh_tokens_per_s"], 3)
    print(json.dumps(result, indent=1))
    Path(args.out, f"concurrent{args.tag}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
