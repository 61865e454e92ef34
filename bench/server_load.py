"""The shared-server workload: one `quail serve`, ADBC clients, phases A to G and late refreshes, figures from the
server's metrics.

    python -m bench.server_load --reviews 5000 --out bench/results/<date>-<device>-server-load-<sha>.json \\
        -- --model dummy:qwen3-4b --tokenizer .offline/tokenizer --device cuda --precision bf16 --token-budget 16384

Every phase asks `AI_FILTER(PROMPT('<question> {0}', body))` over reviews it
alone reads, but F and G, which read A's; a client is one ADBC connection,
its statements one after another on it:
- A: one statement over `--a-rows` rows: the reference fresh tokens per second;
- B: one client, `--b-statements` statements of `--rows` (20) rows, one after another;
- C: `--clients` (16) clients at once, 2 statements of `--rows` rows each;
- D: `--clients` clients at once, as many different questions over the same `--d-rows` (320) rows;
- E: 5-row statements, one after another, while one statement over `--e-rows` rows runs; against the
  same kind of statements with the server otherwise idle;
- E_firsts (after G_late): the first statement of a new shape (a question not asked before, on a client's new connection,
  after the connection's first round trip, `SELECT 1`, timed apart), `--firsts` of them `--first-gap`
  seconds apart (longer than the scheduler's short window, so each finds the passes a scan runs alone)
  while one statement over `--e-rows` more rows runs; against as many sent with the server otherwise idle
  (E_idle_firsts): each latency and each connection's, and the medians' ratios (in results before 900d91b
  a first's latency held its connection's opening);
- F: A's statement again (a dashboard refresh), right after A;
- G: a new question over A's rows, right after F;
- F_late, G_late: the same two again after B to E (a refresh rarely comes right after
  itself: B to E compute more KV than a GPU's pool holds, so these find what the
  pool kept and what it moved to the host tier), with the other work's fresh tokens;
- with `--flush-rows N`: one statement over N more rows (enough to push A's documents
  out of the host tier too), then F_flushed: A's statement once more.
The phases start once the server has tokenized the ingested texts
(`quail_texts_warming` 0), so that none runs beside that tokenizing.
Each phase reports wall seconds, logical / fresh / cached model tokens (the
server's Prometheus counters, read before and after: a query counts when it
ends, so E's include the long statement's if it ends within E), the resident
tree's hit rate (prompt tokens found resident over those looked up), the tokens
copied back from the host and the disk tiers (counted cached), the share
of the phase's wall time the device ran forward passes, fresh tokens per second
and B's and C's against A's, fresh over logical, and the statements' latencies
(each, sorted, their median and largest, the first lane's first; E's median against E_idle's, and E's
first statement against E_idle's: E_idle's first is the server's first 5-row statement, E's the first
sent into the long scan).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa

from bench.datagen import numbered_reviews
from bench.provenance import device_name, git_commit
from quail.clients.server_process import ServerProcess, free_port

QUESTIONS = ["Does the review {0} complain about the service?", "Is {0} about the food?",
             "Does {0} mention the price?", "Is the writer of {0} angry?", "Does {0} recommend the place?",
             "Is {0} about a hotel room?", "Does {0} mention a delay?", "Is {0} written by a regular customer?",
             "Does {0} praise the staff?",
             "Is {0} about noise?", "Does {0} ask for a refund?", "Is {0} sarcastic?", "Does {0} mention a child?",
             "Is {0} about breakfast?", "Does {0} compare two places?", "Is {0} mostly positive?"]


INGEST_ROWS = 2_000  # reviews an ingested batch holds
TOPICS = ["parking", "the menu", "desserts", "a wedding", "the music", "the wine list", "a birthday", "the toilets",
          "the terrace", "a cold dish", "the bill", "a booking"]  # new questions: a new shape each (E_firsts)


def statement(first: int, rows: int, question: str = QUESTIONS[0]) -> str:
    return (f"SELECT id FROM reviews WHERE id BETWEEN {first} AND {first + rows - 1} "
            f"AND AI_FILTER(PROMPT('{question}', body))")


class Counters:
    """The server's model-token counters and its device's busy seconds, read from its /metrics."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"

    def read(self) -> dict[str, float]:
        text = urllib.request.urlopen(self.url, timeout=30).read().decode()
        found = re.findall(r'^quail_tokens_total\{kind="(\w+)"\} (\S+)$', text, re.M)
        found += re.findall(r'^quail_kv_(hit|looked_up)_tokens_total (\S+)$', text, re.M)
        found += re.findall(r'^quail_kv_(host|disk)_restored_tokens_total (\S+)$', text, re.M)
        found += re.findall(r'^quail_device_(busy)_seconds_total (\S+)$', text, re.M)
        found += re.findall(r'^quail_texts_(warming) (\S+)$', text, re.M)
        return {kind: float(value) for kind, value in found}

    def warmed(self, timeout: float = 600.0) -> None:
        """Return once the server has tokenized the texts written to it (quail_texts_warming 0)."""
        deadline = time.monotonic() + timeout
        while self.read()["warming"] > 0:
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not tokenize the table's texts in time")
            time.sleep(0.05)


def run(uri: str, queries: list[str], gap: float = 0.0) -> list[float]:
    """Statements one after another on one connection, `gap` seconds between them (a client's: its first
    statement connects, each prepares, runs and closes its own statement, as ADBC's cursor does): each one's
    latency (seconds)."""
    latencies, started = [], time.perf_counter()
    with flight_sql.connect(uri, autocommit=True) as conn:
        for k, query in enumerate(queries):
            if k and gap:
                time.sleep(gap)
                started = time.perf_counter()
            with conn.cursor() as cur:
                cur.execute(query)
                cur.fetch_arrow_table()
            latencies.append(time.perf_counter() - started)
            started = time.perf_counter()
    return latencies


def phase(uri: str, counters: Counters, lanes: list[list[str]]) -> dict:
    """Each lane's statements one after another (a client's), the lanes at once: wall seconds, tokens,
    latencies."""
    before, latencies, lock, firsts = counters.read(), [], threading.Lock(), {}

    def lane(index: int, queries: list[str]) -> None:
        seconds = run(uri, queries)
        with lock:
            latencies.extend(seconds)
            firsts[index] = seconds[0]

    started = time.perf_counter()
    threads = [threading.Thread(target=lane, args=(index, queries)) for index, queries in enumerate(lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    after = counters.read()
    tokens = {kind: int(after.get(kind, 0) - before.get(kind, 0)) for kind in ("logical", "fresh", "cached")}
    ratio = round(tokens["fresh"] / tokens["logical"], 3) if tokens["logical"] else None
    looked_up = after.get("looked_up", 0) - before.get("looked_up", 0)
    hit_rate = round((after.get("hit", 0) - before.get("hit", 0)) / looked_up, 3) if looked_up else None
    busy = round((after.get("busy", 0) - before.get("busy", 0)) / wall, 3)
    restored = {f"{tier}_restored_tokens": int(after.get(tier, 0) - before.get(tier, 0)) for tier in ("host", "disk")}
    return {"wall_s": round(wall, 3), "statements": len(latencies), **{f"{k}_tokens": v for k, v in tokens.items()},
            **restored,
            "fresh_tokens_per_s": round(tokens["fresh"] / wall), "fresh_over_logical": ratio, "kv_hit_rate": hit_rate,
            "device_busy": busy,
            "latency_p50_s": round(statistics.median(latencies), 3), "latency_max_s": round(max(latencies), 3),
            "latency_first_s": round(firsts[0], 4),
            "latencies_s": sorted(round(seconds, 4) for seconds in latencies)}


def firsts(uri: str, rows: list[int], topics: list[str], gap: float, running: threading.Event | None = None) -> dict:
    """New shapes' first statements, each a new question over 5 rows of its own on a new connection, `gap`
    seconds apart (while `running` is set, where given): the connection opened and its first round trip
    (`SELECT 1`) timed apart (`connect_s`), then the new question's statement on it (`latencies_s`); the
    medians of both."""
    latencies, connects = [], []
    for n, (first, topic) in enumerate(zip(rows, topics)):
        if n:
            time.sleep(gap)
        if running is not None and not running.is_set():
            break
        connect, statement_s = run(uri, ["SELECT 1", statement(first, 5, f"Does {{0}} mention {topic}?")])
        latencies.append(statement_s)
        connects.append(connect)

    def median(seconds: list[float]) -> float | None:
        return round(statistics.median(seconds), 4) if seconds else None

    return {"statements": len(latencies), "latencies_s": [round(seconds, 4) for seconds in latencies],
            "latency_p50_s": median(latencies), "connect_s": [round(seconds, 4) for seconds in connects],
            "connect_p50_s": median(connects)}


def under_scan(uri: str, scan: str, delay: float, measure: Callable[[threading.Event], dict]) -> dict:
    """`measure` run `delay` seconds into the statement `scan` (on a connection of its own), given an event
    set while the scan runs; what it measured, and whether the scan ran throughout."""
    running = threading.Event()
    running.set()
    long = threading.Thread(target=lambda: (run(uri, [scan]), running.clear()))
    long.start()
    time.sleep(delay)
    out = measure(running)
    out["long_running_throughout"] = running.is_set()
    long.join()
    return out


def workload(uri: str, counters: Counters, args: argparse.Namespace) -> dict:
    """The phases, each over rows of its own (F and G over A's, right after it, and again after B to E), once
    the server has tokenized the table's texts."""
    counters.warmed()
    a, nxt = 0, args.a_rows
    n = args.rows
    b, nxt = nxt, nxt + n * args.b_statements
    c, nxt = nxt, nxt + args.clients * 2 * n
    d, nxt = nxt, nxt + args.d_rows
    e_idle, nxt = nxt, nxt + 5 * args.e_statements
    e_long, nxt = nxt, nxt + args.e_rows
    e_short, nxt = nxt, nxt + 5 * args.e_statements
    firsts_idle, nxt = nxt, nxt + 5 * args.firsts
    firsts_long, nxt = nxt, nxt + args.e_rows
    firsts_scan, nxt = nxt, nxt + 5 * args.firsts
    run(uri, [statement(nxt, n)])  # first runs of the statements' shapes
    out = {"A": phase(uri, counters, [[statement(a, args.a_rows)]])}
    out["F"] = phase(uri, counters, [[statement(a, args.a_rows)]])
    out["G"] = phase(uri, counters, [[statement(a, args.a_rows, QUESTIONS[1])]])
    out["B"] = phase(uri, counters, [[statement(b + n * k, n) for k in range(args.b_statements)]])
    out["C"] = phase(uri, counters, [[statement(c + 2 * n * k + n * j, n) for j in range(2)]
                                     for k in range(args.clients)])
    out["D"] = phase(uri, counters, [[statement(d, args.d_rows, question)] for question in QUESTIONS[:args.clients]])
    out["E_idle"] = phase(uri, counters, [[statement(e_idle + 5 * k, 5) for k in range(args.e_statements)]])
    out["E"] = under_scan(uri, statement(e_long, args.e_rows), args.e_delay, lambda _: phase(
        uri, counters, [[statement(e_short + 5 * k, 5) for k in range(args.e_statements)]]))
    out["E"]["against_idle"] = round(out["E"]["latency_p50_s"] / out["E_idle"]["latency_p50_s"], 2)
    out["E"]["first_against_idle_first"] = round(out["E"]["latency_first_s"] / out["E_idle"]["latency_first_s"], 2)
    out["F_late"] = phase(uri, counters, [[statement(a, args.a_rows)]])
    out["G_late"] = phase(uri, counters, [[statement(a, args.a_rows, QUESTIONS[2])]])
    out["F_late"]["against_F"] = round(out["F_late"]["wall_s"] / out["F"]["wall_s"], 2)
    out["F_late"]["other_fresh_tokens"] = sum(out[name]["fresh_tokens"] for name in ("B", "C", "D", "E_idle", "E"))
    if args.firsts:
        count, gap = args.firsts, args.first_gap
        out["E_idle_firsts"] = firsts(uri, [firsts_idle + 5 * k for k in range(count)], TOPICS[:count], gap)
        out["E_firsts"] = under_scan(uri, statement(firsts_long, args.e_rows), args.e_delay, lambda running: firsts(
            uri, [firsts_scan + 5 * k for k in range(count)], TOPICS[count:], gap, running))
        if out["E_firsts"]["statements"]:
            for key, ratio in (("latency_p50_s", "against_idle"), ("connect_p50_s", "connect_against_idle")):
                out["E_firsts"][ratio] = round(out["E_firsts"][key] / out["E_idle_firsts"][key], 2)
    if args.flush_rows:
        out["flush"] = phase(uri, counters, [[statement(nxt + n, args.flush_rows)]])
        out["F_flushed"] = phase(uri, counters, [[statement(a, args.a_rows)]])
    reference = out["A"]["fresh_tokens_per_s"]
    for name in ("B", "C"):
        out[name]["against_A"] = round(out[name]["fresh_tokens_per_s"] / reference, 3) if reference else None
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reviews", type=int, default=5000)
    p.add_argument("--tokens", type=float, default=300, help="tokens a review, about")
    p.add_argument("--a-rows", type=int, default=640)
    p.add_argument("--b-statements", type=int, default=32)
    p.add_argument("--rows", type=int, default=20, help="rows of a B or C statement")
    p.add_argument("--clients", type=int, default=16, help="clients of C and D (at most 16)")
    p.add_argument("--d-rows", type=int, default=320)
    p.add_argument("--e-rows", type=int, default=2000)
    p.add_argument("--e-statements", type=int, default=8)
    p.add_argument("--e-delay", type=float, default=2.0, help="seconds from the long statement to the first short")
    p.add_argument("--firsts", type=int, default=3, help=f"new shapes' first statements, idle and under a scan "
                   f"(at most {len(TOPICS) // 2})")
    p.add_argument("--first-gap", type=float, default=1.5, help="seconds between two of them")
    p.add_argument("--flush-rows", type=int, default=0, help="rows of the statement before F_flushed (0: none)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv[:split])
    serve_args = argv[split + 1:]
    needed = args.a_rows + args.rows * (args.b_statements + 2 * args.clients + 1) + args.d_rows \
        + 10 * args.e_statements + args.e_rows + args.flush_rows + (10 * args.firsts + args.e_rows) * bool(args.firsts)
    if args.firsts > len(TOPICS) // 2:
        p.error(f"--firsts takes at most {len(TOPICS) // 2}")
    if args.reviews < needed:
        p.error(f"the phases read {needed} reviews: pass --reviews {needed} or more")
    port = free_port()
    with tempfile.TemporaryDirectory() as data, \
            ServerProcess(data, "--metrics-port", str(port), *serve_args) as server:
        with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
            reviews = numbered_reviews(args.reviews, args.tokens)  # in batches: a message stays under 16 MiB
            cur.adbc_ingest("reviews", pa.Table.from_batches(reviews.to_batches(max_chunksize=INGEST_ROWS)),
                            mode="create")
        device = serve_args[serve_args.index("--device") + 1] if "--device" in serve_args[:-1] else "cpu"
        result = {"date": dt.datetime.now(dt.timezone.utc).isoformat(), "device": device_name(device),
                  "git_commit": git_commit(), "serve_args": serve_args,
                  "command": "python -m bench.server_load " + " ".join(argv), **vars(args),
                  "phases": workload(server.uri, Counters(port), args)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
