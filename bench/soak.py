"""A soak run: many clients mixing plain, AI, metadata and write calls against one server for a while.

Reports the server's resident memory at the start (after a first round of
every kind of call) and the end, its peak, latency percentiles per kind of
call, and every error (there should be none).

    python -m bench.soak --clients 32 --minutes 30 --out bench/results/soak.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa

from quail.clients.server_process import ServerProcess

REVIEWS = pa.table({
    "id": pa.array(range(400), pa.int64()),
    "stars": pa.array([i % 5 + 1 for i in range(400)], pa.int64()),
    "body": [f"Review {i}: the {['soup', 'film', 'room', 'car'][i % 4]} was "
             f"{['great', 'cold', 'fine', 'late'][i % 7 % 4]}." for i in range(400)],
})
PLAIN = ["SELECT stars, count(*) AS n, avg(id) AS a FROM reviews GROUP BY stars ORDER BY stars",
         "SELECT id, body FROM reviews WHERE id % 37 = {k} ORDER BY id",
         "SELECT count(*) FROM reviews a JOIN reviews b ON a.stars = b.stars WHERE a.id < {k}"]
AI = ["SELECT id FROM reviews WHERE id BETWEEN {k} AND {k} + 2 AND AI_FILTER(PROMPT('Is {{0}} about food?', body))",
      "SELECT id, AI_SCORE(PROMPT('Is {{0}} positive?', body)) AS s FROM reviews WHERE id BETWEEN {k} AND {k} + 1"]


def rss_kib(pid: int) -> int:
    """A process's resident memory (KiB), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def client(uri: str, number: int, until: float, latencies: dict, errors: list, lock: threading.Lock) -> None:
    """One client's loop: a call of a random kind, timed, until `until`."""
    rng = random.Random(number)
    with flight_sql.connect(uri, autocommit=True) as conn:
        while time.monotonic() < until:
            roll, k = rng.random(), rng.randrange(30)
            kind = "plain" if roll < 0.55 else "metadata" if roll < 0.8 else "ai" if roll < 0.95 else "write"
            started = time.monotonic()
            try:
                with conn.cursor() as cur:
                    if kind == "plain":
                        cur.execute(rng.choice(PLAIN).format(k=k))
                        cur.fetch_arrow_table()
                    elif kind == "ai":
                        cur.execute(rng.choice(AI).format(k=k * 10))
                        cur.fetch_arrow_table()
                    elif kind == "metadata":
                        rng.choice([lambda: conn.adbc_get_objects().read_all(),
                                    lambda: conn.adbc_get_table_schema("reviews"),
                                    lambda: conn.adbc_get_info(), lambda: conn.adbc_get_table_types()])()
                    else:
                        cur.adbc_ingest(f"scratch_{number}", pa.table({"k": [k], "at": [time.time()]}),
                                        mode="create_append")
                        cur.execute(f"SELECT count(*) FROM scratch_{number}")
                        cur.fetchall()
            except Exception as err:  # noqa: BLE001 - every error is a finding of the soak
                with lock:
                    errors.append(f"{kind}: {str(err)[:300]}")
            with lock:
                latencies[kind].append(time.monotonic() - started)


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else (values[0] if values else 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as data, ServerProcess(Path(data)) as server:
        pid = server.process.pid
        with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.adbc_ingest("reviews", REVIEWS, mode="create")
        latencies: dict[str, list[float]] = defaultdict(list)
        errors: list[str] = []
        lock = threading.Lock()
        client(server.uri, args.clients, time.monotonic() + 20, latencies, errors, lock)  # warm: every kind once+
        start_rss, peak = rss_kib(pid), 0
        latencies.clear()
        until = time.monotonic() + args.minutes * 60
        threads = [threading.Thread(target=client, args=(server.uri, n, until, latencies, errors, lock))
                   for n in range(args.clients)]
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            peak = max(peak, rss_kib(pid))
            time.sleep(5)
        end_rss = rss_kib(pid)
        alive = server.process.poll() is None
    all_calls = [v for values in latencies.values() for v in values]
    result = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(), "clients": args.clients, "minutes": args.minutes,
        "command": f"python -m bench.soak --clients {args.clients} --minutes {args.minutes:g}",
        "server_alive_at_end": alive, "rss_mib": {"start": round(start_rss / 1024, 1), "end": round(end_rss / 1024, 1),
                                                  "peak": round(peak / 1024, 1)},
        "calls": {kind: {"count": len(v), "p50_s": round(_percentile(v, 50), 4), "p99_s": round(_percentile(v, 99), 4)}
                  for kind, v in sorted(latencies.items())},
        "all": {"count": len(all_calls), "p50_s": round(_percentile(all_calls, 50), 4),
                "p99_s": round(_percentile(all_calls, 99), 4)},
        "errors": len(errors), "error_samples": errors[:20],
    }
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0 if alive and not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
