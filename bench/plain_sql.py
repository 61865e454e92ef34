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
import importlib.metadata
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import adbc_driver_flightsql.dbapi as flight_sql
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from bench.flight_floor import TRANSPORTS
from bench.run import device_name, git_commit, short_device, versions
from quail.clients.server_process import ServerProcess, free_port

RESULTS = Path(__file__).parent / "results"
KV_ROWS = 10_000
ROUND_TRIPS = {"select_1": "SELECT 1", "point_lookup": "SELECT v FROM kv WHERE k = 42"}
KV_INDEX = "CREATE INDEX kv_k ON kv (k)"
AGG = "SELECT g, count(*) AS n, sum(x) AS sx, avg(y) AS ay FROM big GROUP BY g ORDER BY g"
WARM_UP = 10
TIMED_RUNS = 3
INGEST_BATCH = 1_000_000  # rows of big an adbc_ingest call sends
INGEST_CHUNK = 65_536  # rows a record batch: a Flight message stays under gRPC's usual 16 MiB limit
ROAPI_START_TIMEOUT = 600.0
ROAPI_INSTALL = "pip install roapi (its wheel ships the roapi binary, whose --addr-flight-sql serves Flight SQL)"

SUITE = {
    "q01_pricing_summary": """
        SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sum_qty, sum(l_extendedprice) AS sum_base_price,
               sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
               sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge,
               avg(l_quantity) AS avg_qty, avg(l_discount) AS avg_disc, count(*) AS count_order
        FROM lineitem WHERE l_shipdate <= DATE '1998-09-02'
        GROUP BY l_returnflag, l_linestatus ORDER BY l_returnflag, l_linestatus""",
    "q02_filtered_scan": """
        SELECT sum(l_extendedprice * l_discount) AS revenue FROM lineitem
        WHERE l_shipdate >= DATE '1994-01-01' AND l_shipdate < DATE '1995-01-01'
          AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24""",
    "q03_join3_top10": """
        SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) AS revenue, o_orderdate
        FROM customer JOIN orders ON c_custkey = o_custkey JOIN lineitem ON l_orderkey = o_orderkey
        WHERE c_mktsegment = 'BUILDING' AND o_orderdate < DATE '1995-03-15' AND l_shipdate > DATE '1995-03-15'
        GROUP BY l_orderkey, o_orderdate ORDER BY revenue DESC, o_orderdate, l_orderkey LIMIT 10""",
    "q04_join2_distinct": """
        SELECT o_orderpriority, count(DISTINCT o_orderkey) AS order_count
        FROM orders JOIN lineitem ON l_orderkey = o_orderkey
        WHERE o_orderdate >= DATE '1993-07-01' AND o_orderdate < DATE '1993-10-01' AND l_shipdate > o_orderdate
        GROUP BY o_orderpriority ORDER BY o_orderpriority""",
    "q05_join4_by_nation": """
        SELECT n_name, sum(l_extendedprice * (1 - l_discount)) AS revenue
        FROM customer JOIN orders ON c_custkey = o_custkey JOIN lineitem ON l_orderkey = o_orderkey
             JOIN nation ON c_nationkey = n_nationkey
        WHERE n_regionkey = 2 AND o_orderdate >= DATE '1994-01-01' AND o_orderdate < DATE '1995-01-01'
        GROUP BY n_name ORDER BY revenue DESC, n_name""",
    "q06_top20": """
        SELECT l_orderkey, l_linenumber, l_extendedprice FROM lineitem
        ORDER BY l_extendedprice DESC, l_orderkey, l_linenumber LIMIT 20""",
    "q07_window_rank": """
        SELECT c_nationkey, c_custkey, c_acctbal, rn FROM (
            SELECT c_nationkey, c_custkey, c_acctbal,
                   row_number() OVER (PARTITION BY c_nationkey ORDER BY c_acctbal DESC, c_custkey) AS rn
            FROM customer) ranked
        WHERE rn <= 3 ORDER BY c_nationkey, rn""",
    "q08_window_running_sum": """
        SELECT y, m, revenue, sum(revenue) OVER (ORDER BY y, m) AS running FROM (
            SELECT EXTRACT(year FROM o_orderdate) AS y, EXTRACT(month FROM o_orderdate) AS m,
                   sum(o_totalprice) AS revenue
            FROM orders GROUP BY EXTRACT(year FROM o_orderdate), EXTRACT(month FROM o_orderdate)) monthly
        ORDER BY y, m""",
    "q09_distinct_count": """
        SELECT l_shipmode, count(DISTINCT l_partkey) AS parts, count(*) AS lines
        FROM lineitem GROUP BY l_shipmode ORDER BY l_shipmode""",
    "q10_case_promo_share": """
        SELECT 100 * sum(CASE WHEN p_type LIKE 'PROMO%' THEN l_extendedprice * (1 - l_discount) ELSE 0 END)
               / sum(l_extendedprice * (1 - l_discount)) AS promo_revenue
        FROM lineitem JOIN part ON l_partkey = p_partkey
        WHERE l_shipdate >= DATE '1995-09-01' AND l_shipdate < DATE '1995-10-01'""",
    "q11_case_counts": """
        SELECT l_shipmode,
               sum(CASE WHEN o_orderpriority = '1-URGENT' OR o_orderpriority = '2-HIGH' THEN 1 ELSE 0 END) AS high,
               sum(CASE WHEN o_orderpriority <> '1-URGENT' AND o_orderpriority <> '2-HIGH' THEN 1 ELSE 0 END) AS low
        FROM orders JOIN lineitem ON o_orderkey = l_orderkey
        WHERE l_shipmode IN ('MAIL', 'SHIP') AND l_shipdate >= DATE '1994-01-01' AND l_shipdate < DATE '1995-01-01'
        GROUP BY l_shipmode ORDER BY l_shipmode""",
    "q12_left_join_distribution": """
        SELECT c_count, count(*) AS custdist FROM (
            SELECT c_custkey, count(o_orderkey) AS c_count
            FROM customer LEFT JOIN orders ON c_custkey = o_custkey AND o_orderpriority <> '5-LOW'
            GROUP BY c_custkey) counts
        GROUP BY c_count ORDER BY custdist DESC, c_count DESC""",
    "q13_in_subquery_having": """
        SELECT o_orderkey, o_custkey, o_totalprice, sum(l_quantity) AS qty
        FROM orders JOIN lineitem ON o_orderkey = l_orderkey
        WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem GROUP BY l_orderkey HAVING sum(l_quantity) > 170)
        GROUP BY o_orderkey, o_custkey, o_totalprice ORDER BY o_totalprice DESC, o_orderkey LIMIT 20""",
    "q14_like_in_group": """
        SELECT p_brand, count(*) AS lines, avg(l_quantity) AS avg_qty
        FROM lineitem JOIN part ON l_partkey = p_partkey
        WHERE p_type NOT LIKE 'STANDARD%' AND p_size IN (3, 9, 14, 19, 23, 36, 45, 49)
        GROUP BY p_brand ORDER BY lines DESC, p_brand LIMIT 10""",
}


# ---- data ----------------------------------------------------------------------------------------------

def _h(column: int, seed: int, modulo: int) -> str:
    """SQL for a deterministic BIGINT in [0, modulo) of row `i`: DuckDB's hash of (i, column, seed)."""
    return f"CAST(hash(i, {column}, {seed}) % {modulo} AS BIGINT)"


def _pick(column: int, seed: int, values: list[str]) -> str:
    """SQL choosing one of `values` for row `i` by hash."""
    items = ", ".join(f"'{v}'" for v in values)
    return f"([{items}])[1 + {_h(column, seed, len(values))}]"


def _money(column: int, seed: int, low_cents: int, high_cents: int) -> str:
    """SQL for a DOUBLE amount in [low, high) with whole cents."""
    return f"CAST({low_cents} + {_h(column, seed, high_cents - low_cents)} AS DOUBLE) / 100"


def _date(column: int, seed: int, first: str, days: int) -> str:
    return f"DATE '{first}' + CAST({_h(column, seed, days)} AS INTEGER)"


def table_sql(rows: int, seed: int) -> dict[str, str]:
    """Each generated table's DuckDB SELECT over range(): kv and the suite's TPC-H-shaped tables. Contract:
    lineitem max(1000, rows // 10) rows, 4 lines an order; every foreign key names an existing row."""
    lines = max(1000, rows // 10)
    orders = (lines + 3) // 4
    customers = max(25, orders // 10)
    parts = max(20, lines // 50)
    segments = ["AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY"]
    priorities = ["1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW"]
    modes = ["AIR", "FOB", "MAIL", "RAIL", "REG AIR", "SHIP", "TRUCK"]
    types = ["PROMO BRUSHED TIN", "STANDARD POLISHED STEEL", "ECONOMY ANODIZED COPPER", "PROMO PLATED BRASS",
             "LARGE BURNISHED NICKEL", "MEDIUM PLATED TIN"]
    return {
        "kv": f"SELECT i AS k, {_h(1, seed, 1_000_000_000)} AS v FROM range({KV_ROWS}) t(i)",
        "nation": "SELECT CAST(i AS INTEGER) AS n_nationkey, 'NATION_' || CAST(i AS VARCHAR) AS n_name, "
                  "CAST(i % 5 AS INTEGER) AS n_regionkey FROM range(25) t(i)",
        "customer": f"SELECT i AS c_custkey, 'Customer#' || lpad(CAST(i AS VARCHAR), 9, '0') AS c_name, "
                    f"CAST({_h(1, seed, 25)} AS INTEGER) AS c_nationkey, {_pick(2, seed, segments)} AS c_mktsegment, "
                    f"{_money(3, seed, -100_000, 1_000_000)} AS c_acctbal FROM range({customers}) t(i)",
        "orders": f"SELECT i AS o_orderkey, {_h(1, seed, customers)} AS o_custkey, "
                  f"{_pick(2, seed, ['F', 'O', 'P'])} AS o_orderstatus, "
                  f"{_money(3, seed, 100_000, 50_000_000)} AS o_totalprice, "
                  f"{_date(4, seed, '1992-01-01', 2400)} AS o_orderdate, "
                  f"{_pick(5, seed, priorities)} AS o_orderpriority FROM range({orders}) t(i)",
        "lineitem": f"SELECT i // 4 AS l_orderkey, CAST(i % 4 + 1 AS INTEGER) AS l_linenumber, "
                    f"{_h(1, seed, parts)} AS l_partkey, CAST(1 + {_h(2, seed, 50)} AS INTEGER) AS l_quantity, "
                    f"{_money(3, seed, 100, 10_000_000)} AS l_extendedprice, "
                    f"CAST({_h(4, seed, 11)} AS DOUBLE) / 100 AS l_discount, "
                    f"CAST({_h(5, seed, 9)} AS DOUBLE) / 100 AS l_tax, "
                    f"{_pick(6, seed, ['A', 'N', 'R'])} AS l_returnflag, {_pick(7, seed, ['F', 'O'])} AS l_linestatus, "
                    f"{_date(8, seed, '1992-01-02', 2500)} AS l_shipdate, {_pick(9, seed, modes)} AS l_shipmode "
                    f"FROM range({lines}) t(i)",
        "part": f"SELECT i AS p_partkey, 'Brand#' || CAST(11 + {_h(1, seed, 45)} AS VARCHAR) AS p_brand, "
                f"{_pick(2, seed, types)} AS p_type, CAST(1 + {_h(3, seed, 50)} AS INTEGER) AS p_size "
                f"FROM range({parts}) t(i)",
    }


def big_sql(rows: int, seed: int) -> str:
    """The SELECT that makes `big`: `rows` rows, g in 100 groups, x BIGINT, y DOUBLE."""
    return (f"SELECT CAST({_h(1, seed, 100)} AS INTEGER) AS g, {_h(2, seed, 1_000_000)} AS x, "
            f"CAST({_h(3, seed, 1_000_000)} AS DOUBLE) / 1000 AS y FROM range({rows}) t(i)")


@dataclass
class Data:
    """The generated tables (kv and the suite's) as Arrow, and how to make `big`."""
    tables: dict[str, pa.Table]
    big_sql: str


def generate(rows: int, seed: int) -> Data:
    """The tables of table_sql, made by DuckDB in-process."""
    with duckdb.connect() as con:
        tables = {name: con.sql(sql).to_arrow_table() for name, sql in table_sql(rows, seed).items()}
    return Data(tables, big_sql(rows, seed))


# ---- engines -------------------------------------------------------------------------------------------

class Engine(Protocol):
    def query(self, sql: str) -> list[tuple]:
        """Run one statement and fetch all of its rows."""


class DuckDBEngine:
    """DuckDB in-process on one reused connection."""

    def __init__(self) -> None:
        self.con = duckdb.connect()

    def query(self, sql: str) -> list[tuple]:
        return self.con.execute(sql).fetchall()


class FlightEngine:
    """A Flight SQL server through ADBC: one connection (autocommit) and one reused cursor."""

    def __init__(self, uri: str) -> None:
        self.conn = flight_sql.connect(uri, autocommit=True)
        self.cursor = self.conn.cursor()

    def query(self, sql: str) -> list[tuple]:
        self.cursor.execute(sql)
        return self.cursor.fetchall()

    def close(self) -> None:
        self.cursor.close()
        self.conn.close()


def error_text(err: BaseException) -> str:
    """An exception as one line (its message's first) for the result file."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:500]


def try_sql(engine: Engine, sql: str) -> bool | str:
    """True when the engine ran the statement, else its error text."""
    try:
        engine.query(sql)
        return True
    except Exception as err:  # noqa: BLE001 - an engine's refusal is a result
        return error_text(err)


def since(started: float) -> float:
    """Seconds from `started` (a perf_counter reading) to now, rounded for the result file."""
    return round(time.perf_counter() - started, 4)


@contextmanager
def duckdb_engine(data: Data) -> Iterator[tuple[Engine, dict[str, Any]]]:
    """DuckDB in-process: tables copied from Arrow, `big` by CREATE TABLE AS over range()."""
    engine, setup = DuckDBEngine(), {"how": f"in-process, duckdb {duckdb.__version__}"}
    try:
        started = time.perf_counter()
        for name, table in data.tables.items():
            engine.con.register("source", table)
            engine.query(f"CREATE TABLE {name} AS SELECT * FROM source")
            engine.con.unregister("source")
        setup["kv_index"] = try_sql(engine, KV_INDEX)
        setup["load_s"] = since(started)
        started = time.perf_counter()
        engine.query(f"CREATE TABLE big AS {data.big_sql}")
        setup.update(big_create_s=since(started), big_create_how="CREATE TABLE big AS SELECT ... FROM range(N)")
        yield engine, setup
    finally:
        engine.con.close()


def ingest(engine: FlightEngine, name: str, table: pa.Table, mode: str) -> bool | str:
    """adbc_ingest in record batches of at most INGEST_CHUNK rows: True, or the error text."""
    try:
        engine.cursor.adbc_ingest(name, pa.Table.from_batches(table.to_batches(INGEST_CHUNK), table.schema), mode=mode)
        return True
    except Exception as err:  # noqa: BLE001
        return error_text(err)


def ingest_big(engine: FlightEngine, data: Data) -> bool | str:
    """`big` through adbc_ingest, generated in-process: the first INGEST_BATCH rows create it, each next
    batch appends. True, or the first error's text."""
    with duckdb.connect() as con:
        for k, batch in enumerate(con.sql(data.big_sql).to_arrow_reader(INGEST_BATCH)):
            done = ingest(engine, "big", pa.Table.from_batches([batch]), "append" if k else "create")
            if done is not True:
                return done
    return True


@contextmanager
def quail_engine(data: Data) -> Iterator[tuple[Engine, dict[str, Any]]]:
    """`quail serve --dialect duckdb` over a temporary data directory; tables through adbc_ingest; `big` by
    CREATE TABLE AS over range() where the server accepts it, else ingested in batches."""
    with tempfile.TemporaryDirectory() as data_dir:
        started = time.perf_counter()
        with ServerProcess(data_dir, "--dialect", "duckdb", "--log-level", "warning") as server:
            setup: dict[str, Any] = {"how": "quail serve --dialect duckdb, ADBC Flight SQL", "start_s": since(started)}
            engine = FlightEngine(server.uri)
            try:
                started = time.perf_counter()
                loaded = {name: ingest(engine, name, table, "create") for name, table in data.tables.items()}
                setup["load_errors"] = {name: text for name, text in loaded.items() if text is not True}
                setup["kv_index"] = try_sql(engine, KV_INDEX)
                setup["load_s"] = since(started)
                started = time.perf_counter()
                created = try_sql(engine, f"CREATE TABLE big AS {data.big_sql}")
                if created is True:
                    setup["big_create_how"] = "CREATE TABLE big AS SELECT ... FROM range(N), server-side"
                else:
                    started = time.perf_counter()
                    ingested = ingest_big(engine, data)
                    setup["big_create_how"] = (f"adbc_ingest in batches of {INGEST_BATCH:,} rows generated in-process "
                                               f"(CREATE TABLE AS refused: {created})")
                    if ingested is not True:
                        setup["load_errors"]["big"] = ingested
                setup["big_create_s"] = since(started)
                yield engine, setup
            finally:
                engine.close()


def roapi_binary() -> str | None:
    """The roapi executable beside this Python (its virtualenv) or on PATH, else None."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which("roapi", path=path)


def wait_for_line(log: Path, marker: str, process: subprocess.Popen, timeout: float) -> None:
    """Return once `marker` appears in the log; raise if the process exits or the timeout passes."""
    deadline = time.monotonic() + timeout
    while marker not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"roapi did not become ready: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)


@contextmanager
def roapi_engine(data: Data, binary: str) -> Iterator[tuple[Engine, dict[str, Any]]]:
    """roapi (DataFusion) serving Parquet files through its Flight SQL frontend. Its tables are files it
    loads at start: the suite's by pyarrow, `big` by DuckDB's COPY of the same SELECT."""
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        for name, table in data.tables.items():
            pq.write_table(table, Path(folder) / f"{name}.parquet")
        setup: dict[str, Any] = {"load_s": since(started)}
        started = time.perf_counter()
        with duckdb.connect() as con:
            con.execute(f"COPY ({data.big_sql}) TO '{Path(folder) / 'big.parquet'}' (FORMAT parquet)")
        setup.update(big_create_s=since(started),
                     big_create_how="COPY (SELECT ... FROM range(N)) TO Parquet by DuckDB in-process; "
                                    "roapi loads it at start (start_s)")
        port = free_port()
        tables = [f"{name}={Path(folder) / f'{name}.parquet'}" for name in [*data.tables, "big"]]
        args = [binary, "--addr-flight-sql", f"127.0.0.1:{port}", "-a", f"127.0.0.1:{free_port()}",
                "-p", f"127.0.0.1:{free_port()}", *(arg for table in tables for arg in ("-t", table))]
        log = Path(folder) / "roapi.log"
        started = time.perf_counter()
        with log.open("w") as out:
            process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for_line(log, "for FlightSQL traffic", process, ROAPI_START_TIMEOUT)
            setup.update(start_s=since(started), how=f"roapi {package_version('roapi')}, ADBC Flight SQL")
            engine = FlightEngine(f"grpc://127.0.0.1:{port}")
            setup["kv_index"] = try_sql(engine, KV_INDEX)
            try:
                yield engine, setup
            finally:
                engine.close()
        finally:
            process.terminate()
            process.wait(30)


@contextmanager
def floor_engine(transport: str) -> Iterator[FlightEngine]:
    """A transport floor (bench/flight_floor.py) in its own process, through ADBC."""
    process = subprocess.Popen([sys.executable, "-m", "bench.flight_floor", transport], stdout=subprocess.PIPE,
                               text=True, cwd=Path(__file__).parent.parent)
    try:
        engine = FlightEngine(f"grpc://127.0.0.1:{int(process.stdout.readline())}")
        try:
            yield engine
        finally:
            engine.close()
    finally:
        process.terminate()
        process.wait(30)


def measure_floors(repeat: int) -> dict[str, Any]:
    """Each transport floor's `SELECT 1` round trip."""
    floors: dict[str, Any] = {}
    for transport in TRANSPORTS:
        print(f"plain_sql: {transport} floor ...", file=sys.stderr, flush=True)
        with floor_engine(transport) as engine:
            floors[transport] = {"round_trip_ms": {"select_1": round_trip(engine, ROUND_TRIPS["select_1"], repeat)}}
    return floors


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


# ---- the run -------------------------------------------------------------------------------------------

def package_version(name: str) -> str:
    """An installed distribution's version, or "absent"."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


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
