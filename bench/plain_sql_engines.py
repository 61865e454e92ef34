"""The engines the plain-SQL benchmark measures (bench/plain_sql.py), each with its tables loaded.

- `Engine`: what the measuring needs of one (run a statement, fetch its rows); `DuckDBEngine` and
  `FlightEngine` (a Flight SQL server through ADBC);
- `duckdb_engine`, `quail_engine`, `roapi_engine`: each engine started with the generated tables and `big`
  (`ingest`, `ingest_big`, `roapi_binary`, `wait_for_line` help), and its setup's timings;
- `floor_engine`: a transport floor (bench/flight_floor.py) in its own process;
- `error_text`, `try_sql`, `since`, `package_version`: what the engines and the result file share.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Protocol

import adbc_driver_flightsql.dbapi as flight_sql
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from bench.plain_sql_data import Data
from quail.clients.server_process import ServerProcess, free_port

KV_INDEX = "CREATE INDEX kv_k ON kv (k)"
INGEST_BATCH = 1_000_000  # rows of big an adbc_ingest call sends
INGEST_CHUNK = 65_536  # rows a record batch: a Flight message stays under gRPC's usual 16 MiB limit
ROAPI_START_TIMEOUT = 600.0


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


def package_version(name: str) -> str:
    """An installed distribution's version, or "absent"."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"
