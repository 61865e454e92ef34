"""A soak run: many clients mixing plain, AI, metadata and write calls against one server for a while.

Reports the server's resident memory at the start (after a first round of
every kind of call) and the end, its peak, latency percentiles per kind of
call, every error (there should be none) and every wrong result: a plain
statement's rows against DuckDB's in-process over the same table, an AI
statement's against its first answer (the model answers greedily: the same
rows every time). The server has users (every client logs in).

With `--hostile`, one more client sends the calls of bench/hostile.py in turn
(huge statements and messages, long stop lists, odd Arrow types, login storms,
...): each must get one of its allowed statuses, and the honest clients'
latencies are compared with a run without it (`--baseline FILE`).

    python -m bench.soak --clients 32 --minutes 30 --out bench/results/soak.json
    python -m bench.soak --clients 32 --minutes 30 --hostile --baseline bench/results/soak.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import random
import statistics
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import adbc_driver_flightsql.dbapi as flight_sql
import duckdb
import pyarrow as pa

from bench.hostile import HOSTILE
from bench.provenance import git_commit
from quail.clients.server_process import ServerProcess

# The ADBC Flight SQL driver (1.13) keeps one map of info codes for every connection of a process and writes
# it on each GetInfo: two at once from different threads end the process ("concurrent map writes").
GET_INFO = threading.Lock()
HONEST = {"username": "honest", "password": "honest-pass"}
MALLORY = {"username": "mallory", "password": "mallory-pass"}

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


class Answers:
    """What each statement should return: a plain one DuckDB's rows over REVIEWS, an AI one its first answer."""

    def __init__(self) -> None:
        self._reference = duckdb.connect()
        self._reference.register("reviews", REVIEWS)
        self._known: dict[str, list] = {}
        self._lock = threading.Lock()
        self.wrong: list[str] = []

    def check(self, sql: str, rows: pa.Table, plain: bool) -> None:
        got = _values(rows)
        with self._lock:
            if sql not in self._known:
                self._known[sql] = _values(self._reference.sql(sql).to_arrow_table()) if plain else got
            if not _same(got, self._known[sql]):
                self.wrong.append(sql[:200])


SCORE_TOLERANCE = 1e-4  # a score computed in another pass's company differs in its last float digits (as in bench/stress.py)


def _values(rows: pa.Table) -> list[tuple]:
    """The rows' values, in an order of their own (column names aside: a dialect names `count(*)` its way)."""
    return sorted((tuple(row.values()) for row in rows.to_pylist()),
                  key=lambda row: repr(tuple(v for v in row if not isinstance(v, float))))


def _get_info(conn) -> None:
    with GET_INFO:
        conn.adbc_get_info()


def _same(got: list[tuple], expected: list[tuple]) -> bool:
    """Whether two sets of rows match, floats within SCORE_TOLERANCE."""
    return len(got) == len(expected) and all(
        len(a) == len(b) and all(math.isclose(x, y, abs_tol=SCORE_TOLERANCE) if isinstance(x, float) and
                                 isinstance(y, float) else x == y for x, y in zip(a, b))
        for a, b in zip(got, expected))


def client(uri: str, number: int, until: float, latencies: dict, errors: list, lock: threading.Lock,
           answers: Answers) -> None:
    """One client's loop: a call of a random kind, timed and its rows checked, until `until`."""
    rng = random.Random(number)
    with flight_sql.connect(uri, db_kwargs=HONEST, autocommit=True) as conn:
        while time.monotonic() < until:
            roll, k = rng.random(), rng.randrange(30)
            kind = "plain" if roll < 0.55 else "metadata" if roll < 0.8 else "ai" if roll < 0.95 else "write"
            started = time.monotonic()
            try:
                with conn.cursor() as cur:
                    if kind in ("plain", "ai"):
                        sql = rng.choice(PLAIN).format(k=k) if kind == "plain" else rng.choice(AI).format(k=k * 10)
                        cur.execute(sql)
                        answers.check(sql, cur.fetch_arrow_table(), kind == "plain")
                    elif kind == "metadata":
                        rng.choice([lambda: conn.adbc_get_objects().read_all(),
                                    lambda: conn.adbc_get_table_schema("reviews"),
                                    lambda: _get_info(conn), lambda: conn.adbc_get_table_types()])()
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


def hostile(uri: str, until: float, statuses: dict, findings: list, lock: threading.Lock) -> None:
    """The hostile client: bench/hostile.py's calls in turn until `until`, each status checked."""
    rng = random.Random(-1)
    while time.monotonic() < until:
        for name, (call, allowed) in HOSTILE.items():
            try:
                got = call(uri, rng, MALLORY)
            except Exception as err:  # noqa: BLE001 - a call that breaks is a finding
                got = f"raised {type(err).__name__}: {str(err)[:200]}"
            with lock:
                statuses[name][got] += 1
                if got not in allowed:
                    findings.append(f"{name}: {got}")
            if time.monotonic() >= until:
                return


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else (values[0] if values else 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--hostile", action="store_true", help="one more client sends bench/hostile.py's calls")
    parser.add_argument("--baseline", default=None, help="a result file of a run without --hostile, to compare")
    args = parser.parse_args(argv)
    commit = git_commit()  # the code the server starts from (the tree may move on during a long run)
    with tempfile.TemporaryDirectory() as data:
        users = Path(data) / "users"
        users.write_text(f"{HONEST['username']}:{HONEST['password']}:write\n"
                         f"{MALLORY['username']}:{MALLORY['password']}:write\n")
        with ServerProcess(Path(data) / "db", "--users", str(users), "--query-timeout", "60") as server:
            result = {"git_commit": commit, **_soak(server, args)}
    if args.baseline:
        base = json.loads(Path(args.baseline).read_text())
        result["baseline"] = {"file": args.baseline, "ai_p99_s": base["calls"]["ai"]["p99_s"],
                              "ai_p99_ratio": round(result["calls"]["ai"]["p99_s"] / base["calls"]["ai"]["p99_s"], 2)}
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    ok = result["server_alive_at_end"] and not result["errors"] and not result["wrong"] and not result.get(
        "hostile", {}).get("findings")
    return 0 if ok else 1


def _soak(server: ServerProcess, args: argparse.Namespace) -> dict:
    """The soak's figures, on a started server."""
    pid = server.process.pid
    with flight_sql.connect(server.uri, db_kwargs=HONEST, autocommit=True) as conn, conn.cursor() as cur:
        cur.adbc_ingest("reviews", REVIEWS, mode="create")
    latencies: dict[str, list[float]] = defaultdict(list)
    errors: list[str] = []
    lock = threading.Lock()
    answers = Answers()
    client(server.uri, args.clients, time.monotonic() + 20, latencies, errors, lock, answers)  # warm-up
    start_rss, peak = rss_kib(pid), 0
    latencies.clear()
    until = time.monotonic() + args.minutes * 60
    threads = [threading.Thread(target=client, args=(server.uri, n, until, latencies, errors, lock, answers))
               for n in range(args.clients)]
    statuses: dict[str, Counter] = defaultdict(Counter)
    findings: list[str] = []
    if args.hostile:
        threads.append(threading.Thread(target=hostile, args=(server.uri, until, statuses, findings, lock)))
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss_kib(pid))
        time.sleep(5)
    end_rss = rss_kib(pid)
    alive = server.process.poll() is None
    all_calls = [v for values in latencies.values() for v in values]
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(), "clients": args.clients,
        "minutes": args.minutes,
        "command": f"python -m bench.soak --clients {args.clients} --minutes {args.minutes:g}"
                   + (" --hostile" if args.hostile else "") + (f" --baseline {args.baseline}" if args.baseline else ""),
        "server_alive_at_end": alive, "rss_mib": {"start": round(start_rss / 1024, 1), "end": round(end_rss / 1024, 1),
                                                  "peak": round(peak / 1024, 1)},
        "calls": {kind: {"count": len(v), "p50_s": round(_percentile(v, 50), 4), "p99_s": round(_percentile(v, 99), 4)}
                  for kind, v in sorted(latencies.items())},
        "all": {"count": len(all_calls), "p50_s": round(_percentile(all_calls, 50), 4),
                "p99_s": round(_percentile(all_calls, 99), 4)},
        "errors": len(errors), "error_samples": errors[:20],
        "wrong": len(answers.wrong), "wrong_samples": answers.wrong[:20],
        **({"hostile": {"calls": {name: dict(counts) for name, counts in statuses.items()},
                        "findings": findings[:50]}} if args.hostile else {}),
    }


if __name__ == "__main__":
    raise SystemExit(main())
