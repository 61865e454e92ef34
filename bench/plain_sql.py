"""Plain SQL speed: Quail over Flight SQL against DuckDB in-process and another Flight SQL server.

    pip install roapi                    # optional: the third engine (the wheel ships the roapi binary)
    python -m bench.plain_sql --rows 1000000 --repeat 50
    python -m bench.plain_sql [--out FILE] [--rows N] [--repeat K] [--seed S]

One run, on one machine, engines one after another (each server runs only for
its own turn):
- `duckdb`: DuckDB in-process, one reused connection (`con.execute(sql).fetchall()`); the reference;
- `quail`: `quail serve --dialect duckdb --log-level warning` over a temporary data directory (the
  embedded model on the CPU; no AI function is used), through ADBC Flight SQL: one connection
  (`autocommit=True`) and one reused cursor, `cursor.execute(sql)` then `fetchall()`;
- `roapi`: roapi's Flight SQL frontend (DataFusion) through the same ADBC client code; where its binary
  is neither beside this Python nor on PATH, the engine is skipped and the result file says why;
- the transport floors (bench/flight_floor.py): Flight SQL servers that answer every statement with one
  fixed row, on grpcio (Quail's transport) and on Arrow's C++ Flight server; `SELECT 1` round trips only.

What it measures:
(a) round trips: `SELECT 1` and a one-row point lookup (`SELECT v FROM kv WHERE k = 42`, a 10,000-row
    table, with `CREATE INDEX` on `k` where the engine accepts it): milliseconds of each statement,
    median and p90 (nearest rank) over K repetitions after 10 warm-up ones; each engine's added
    median milliseconds over DuckDB in-process;
(b) a suite of 14 TPC-H-shaped queries (SUITE) over generated tables: lineitem N/10 rows (at least
    1,000), orders a quarter of that, customer a tenth of orders, part a fiftieth of lineitem, nation 25;
    each query's seconds (median of 3 runs after one warm-up) and their total per engine;
(c) `SELECT g, count(*), sum(x), avg(y) FROM big GROUP BY g ORDER BY g` over N rows in 100 groups
    (median of 3 runs after one warm-up); creating `big` is timed apart: `CREATE TABLE big AS SELECT ...
    FROM range(N)` where the engine accepts it, else batches through `adbc_ingest` (Quail) or a
    Parquet file written by DuckDB (roapi, which loads its tables at start).
The tables are deterministic from --seed (DuckDB's hash() over range(), generated in-process). Every
query's rows, sorted, are compared with DuckDB's (numbers as floats, relative tolerance 1e-9):
`agree` is true when every suite query and the aggregate ran, first and last run alike, and matched.
A statement an engine refuses records its error text and the run goes on.

The result file (default `bench/results/<date>-cpu-plain-sql-<commit>.json`) holds "device", "date",
"git_commit", "command", "versions", "rows", "repeat", "seed", "cpus" and "engines": per engine
"round_trip_ms", "suite_s", "suite_total_s" (null unless every query ran), "agg_10m_s", "agree",
the setup's timings and any "errors"; "floors": per transport its "round_trip_ms" of `SELECT 1`. A
Markdown summary is printed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable

from bench.flight_floor import TRANSPORTS
from bench.plain_sql_data import SUITE, Data, generate
from bench.plain_sql_engines import (Engine, duckdb_engine, error_text, floor_engine, package_version, quail_engine,
                                     roapi_binary, roapi_engine)
from bench.provenance import device_name, git_commit
from bench.run import short_device, versions

RESULTS = Path(__file__).parent / "results"
ROUND_TRIPS = {"select_1": "SELECT 1", "point_lookup": "SELECT v FROM kv WHERE k = 42"}
AGG = "SELECT g, count(*) AS n, sum(x) AS sx, avg(y) AS ay FROM big GROUP BY g ORDER BY g"
WARM_UP = 10
TIMED_RUNS = 3
ROAPI_INSTALL = "pip install roapi (its wheel ships the roapi binary, whose --addr-flight-sql serves Flight SQL)"


# ---- measuring -----------------------------------------------------------------------------------------

def canonical(value: Any) -> Any:
    """A value as compared across engines: every number a float (Decimal, int128 and int alike)."""
    if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
        return float(value)
    return value


def sort_key(row: tuple) -> tuple:
    """A total order over canonical rows that float noise below 6 significant digits does not change."""
    def key(value: Any) -> tuple:
        if value is None:
            return (0, "")
        if isinstance(value, float):
            return (1, float(f"{value:.6g}"))
        return (2, str(value))
    return tuple(key(v) for v in row)


def same_rows(rows: list[tuple], reference: list[tuple]) -> bool:
    """Equal as multisets of rows, numbers within a relative 1e-9."""
    if len(rows) != len(reference):
        return False
    ours = sorted((tuple(map(canonical, r)) for r in rows), key=sort_key)
    theirs = sorted((tuple(map(canonical, r)) for r in reference), key=sort_key)
    for a, b in zip(ours, theirs):
        if len(a) != len(b):
            return False
        for x, y in zip(a, b):
            if isinstance(x, float) and isinstance(y, float):
                if not math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9):
                    return False
            elif x != y:
                return False
    return True


def round_trip(engine: Engine, sql: str, repeat: int) -> dict[str, float]:
    """Milliseconds of one statement, run and fetched: median and nearest-rank p90 over `repeat` runs after
    WARM_UP unmeasured ones."""
    for _ in range(WARM_UP):
        engine.query(sql)
    ms = []
    for _ in range(repeat):
        started = time.perf_counter()
        engine.query(sql)
        ms.append((time.perf_counter() - started) * 1000)
    ms.sort()
    return {"p50": round(statistics.median(ms), 3), "p90": round(ms[math.ceil(0.9 * len(ms)) - 1], 3)}


def timed(engine: Engine, sql: str) -> tuple[float, list[tuple], list[tuple]]:
    """One warm-up run, then TIMED_RUNS timed ones: their median seconds, the warm-up's rows, the last's."""
    first = engine.query(sql)
    seconds, last = [], first
    for _ in range(TIMED_RUNS):
        started = time.perf_counter()
        last = engine.query(sql)
        seconds.append(time.perf_counter() - started)
    return round(statistics.median(seconds), 4), first, last


def measure_round_trips(engine: Engine, repeat: int, errors: dict[str, str]) -> dict[str, dict[str, float] | None]:
    """Each ROUND_TRIPS statement's round_trip figures; None, with its error text in `errors`, where it failed."""
    trips: dict[str, dict[str, float] | None] = {}
    for name, sql in ROUND_TRIPS.items():
        try:
            trips[name] = round_trip(engine, sql, repeat)
        except Exception as err:  # noqa: BLE001 - an engine's refusal is a result
            trips[name], errors[name] = None, error_text(err)
    return trips


def measure(engine: Engine, repeat: int,
            reference: dict[str, list[tuple]] | None) -> tuple[dict[str, Any], dict[str, list[tuple]]]:
    """Round trips, the suite and the aggregate on one engine: its figures, and each query's first rows.
    Every query's first and last rows are compared with `reference`'s (by query name; None: with this
    engine's own first rows, for the engine that is the reference)."""
    errors: dict[str, str] = {}
    trips = measure_round_trips(engine, repeat, errors)
    seconds: dict[str, float | None] = {}
    firsts: dict[str, list[tuple]] = {}
    disagree: list[str] = []
    for name, sql in [*SUITE.items(), ("agg_10m", AGG)]:
        try:
            seconds[name], first, last = timed(engine, sql)
        except Exception as err:  # noqa: BLE001 - an engine's refusal is a result
            seconds[name], errors[name] = None, error_text(err)
            continue
        firsts[name] = first
        expected = first if reference is None else reference.get(name)
        if expected is None or not (same_rows(first, expected) and same_rows(last, expected)):
            disagree.append(name)
    agg = seconds.pop("agg_10m")
    ran = [s for s in seconds.values() if s is not None]
    return {"round_trip_ms": trips, "suite_s": seconds,
            "suite_total_s": round(sum(ran), 4) if len(ran) == len(SUITE) else None, "agg_10m_s": agg,
            "rows_returned": {name: len(rows) for name, rows in firsts.items()},
            "agree": not disagree and len(firsts) == len(SUITE) + 1, "disagree": disagree, "errors": errors}, firsts


def added_ms(result: dict[str, Any], duckdb_result: dict[str, Any]) -> dict[str, float | None]:
    """An engine's median round trip minus DuckDB in-process's, per statement."""
    out = {}
    for name in ROUND_TRIPS:
        ours, base = result["round_trip_ms"].get(name), duckdb_result["round_trip_ms"].get(name)
        out[name] = round(ours["p50"] - base["p50"], 3) if ours and base else None
    return out


def measure_floors(repeat: int) -> dict[str, Any]:
    """Each transport floor's `SELECT 1` round trip."""
    floors: dict[str, Any] = {}
    for transport in TRANSPORTS:
        print(f"plain_sql: {transport} floor ...", file=sys.stderr, flush=True)
        with floor_engine(transport) as engine:
            floors[transport] = {"round_trip_ms": {"select_1": round_trip(engine, ROUND_TRIPS["select_1"], repeat)}}
    return floors


# ---- the run -------------------------------------------------------------------------------------------

def run_engines(data: Data, repeat: int) -> dict[str, Any]:
    """Every engine in turn, DuckDB in-process first: the reference, whose failure ends the run. Another
    engine that fails to start or load is recorded as skipped with the error; a missing roapi with why."""
    reference: dict[str, list[tuple]] | None = None
    engines: dict[str, Any] = {}
    contexts: dict[str, Callable[[], Any]] = {"duckdb": lambda: duckdb_engine(data),
                                              "quail": lambda: quail_engine(data)}
    binary = roapi_binary()
    if binary:
        contexts["roapi"] = lambda: roapi_engine(data, binary)
    else:
        engines["roapi"] = {"skipped": f"no roapi binary beside {sys.executable} or on PATH; {ROAPI_INSTALL}"}
    for name, context in contexts.items():
        print(f"plain_sql: {name} ...", file=sys.stderr, flush=True)
        try:
            with context() as (engine, setup):
                result, firsts = measure(engine, repeat, reference)
        except Exception as err:  # noqa: BLE001 - an engine that cannot start is recorded, not fatal
            if name == "duckdb":
                raise
            engines[name] = {"skipped": error_text(err)}
            continue
        if name == "duckdb":
            reference = firsts
        else:
            result["added_ms_over_duckdb"] = added_ms(result, engines["duckdb"])
        engines[name] = {**setup, **result}
    return engines


def fmt(value: Any, digits: int = 3) -> str:
    """A figure for the Markdown table; "-" for none."""
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(doc: dict[str, Any]) -> str:
    """The summary table (one row per engine), the per-query seconds, and each error and skipped engine."""
    engines = {name: e for name, e in doc["engines"].items() if "skipped" not in e}
    lines = ["| engine | SELECT 1 p50 / p90 ms | point lookup p50 / p90 ms | added p50 ms (1 / lookup) | "
             f"suite total s | {doc['rows']:,}-row agg s | big create s | agree |", "|---" * 8 + "|"]
    for name, e in engines.items():
        trips = [e["round_trip_ms"][k] or {} for k in ROUND_TRIPS]
        added = e.get("added_ms_over_duckdb", {})
        lines.append(f"| {name} | " + " | ".join(f"{fmt(t.get('p50'))} / {fmt(t.get('p90'))}" for t in trips)
                     + f" | {fmt(added.get('select_1'))} / {fmt(added.get('point_lookup'))} | "
                       f"{fmt(e['suite_total_s'])} | {fmt(e['agg_10m_s'])} | {fmt(e['big_create_s'])} | "
                       f"{e['agree']} |")
    for transport, floor in doc["floors"].items():
        trip = floor["round_trip_ms"]["select_1"]
        lines.append(f"| {transport} floor (no work) | {fmt(trip['p50'])} / {fmt(trip['p90'])} |" + " - |" * 6)
    lines += ["", "| query | " + " | ".join(engines) + " |", "|---" * (len(engines) + 1) + "|"]
    for query in SUITE:
        lines.append(f"| {query} | " + " | ".join(fmt(e["suite_s"][query], 4) for e in engines.values()) + " |")
    lines += [f"- {name}: {query}: {text}" for name, e in engines.items() for query, text in e["errors"].items()]
    lines += [f"- {name}: skipped: {e['skipped']}" for name, e in doc["engines"].items() if "skipped" in e]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.plain_sql", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None,
                   help="the result file (default bench/results/<date>-cpu-plain-sql-<sha>.json)")
    p.add_argument("--rows", type=int, default=10_000_000,
                   help="rows of big; lineitem gets a tenth (at least 1,000)")
    p.add_argument("--repeat", type=int, default=200, help="measured repetitions of each round trip")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> Path:
    """Run every engine, write the result file, print the Markdown summary; returns the file's path."""
    argv = sys.argv[1:] if argv is None else argv
    p = parser()
    args = p.parse_args(argv)
    if args.repeat < 1 or args.rows < 1:
        p.error("--rows and --repeat must be positive")
    now = dt.datetime.now(dt.timezone.utc)
    commit, device = git_commit(), device_name("cpu")
    data = generate(args.rows, args.seed)
    doc = {"device": device, "date": now.isoformat(timespec="seconds"), "git_commit": commit,
           "command": "python -m bench.plain_sql " + " ".join(argv),
           "versions": {**versions(), "adbc_driver_flightsql": package_version("adbc-driver-flightsql"),
                        "adbc_driver_manager": package_version("adbc-driver-manager"),
                        "roapi": package_version("roapi")},
           "rows": args.rows, "repeat": args.repeat, "seed": args.seed, "cpus": os.cpu_count(),
           "table_rows": {name: table.num_rows for name, table in data.tables.items()},
           "engines": run_engines(data, args.repeat), "floors": measure_floors(args.repeat)}
    name = f"{now:%Y-%m-%d}-{short_device(device)}-plain-sql-{commit[:7]}.json"
    path = Path(args.out) if args.out else RESULTS / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(markdown(doc))
    print(path)
    return path


if __name__ == "__main__":
    main()
