"""kill -9 of a server in the middle of INSERTs, UPDATEs, ingests and CREATE TABLE ... AS: after a restart over
the same data directory every statement the server acknowledged is there, whole, and no statement is there in
part (the database's write-ahead log, not Quail, makes commits durable)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
import pyarrow as pa

from quail.clients.server_process import ServerProcess

ROWS = 500  # rows each INSERT and each ingest writes
SOURCE_ROWS = 20_000  # rows each CREATE TABLE ... AS copies


def _writer(uri: str, kind: str, acked: dict[str, list[int]], stop: threading.Event) -> None:
    """Run statements of one kind until stopped (or the server dies), noting those acknowledged."""
    try:
        with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            for n in range(10**6):
                if stop.is_set():
                    return
                if kind == "insert":
                    cur.execute(f"INSERT INTO log SELECT {n}, range FROM range({ROWS})")
                elif kind == "update":
                    cur.execute("UPDATE counter SET v = v + 1")
                elif kind == "ingest":
                    cur.adbc_ingest("ingested", pa.table({"batch": [n] * ROWS, "k": list(range(ROWS))}),
                                    mode="create_append")
                else:
                    cur.execute(f"CREATE TABLE copy_{n} AS SELECT * FROM source")
                acked[kind].append(n)
    except adbc_driver_manager.Error:
        return  # the server was killed under this call


def test_a_killed_server_keeps_every_acknowledged_statement_whole_and_no_partial_one(tmp_path):
    with ServerProcess(tmp_path, "--log-level", "warning") as server:
        with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE log (batch INTEGER, k INTEGER)")
            cur.execute("CREATE TABLE counter AS SELECT range AS id, 0 AS v FROM range(100)")
            cur.execute(f"CREATE TABLE source AS SELECT range AS k, 'row ' || range AS text FROM range({SOURCE_ROWS})")
        acked: dict[str, list[int]] = defaultdict(list)
        stop = threading.Event()
        writers = [threading.Thread(target=_writer, args=(server.uri, kind, acked, stop))
                   for kind in ("insert", "update", "ingest", "ctas")]
        for writer in writers:
            writer.start()
        deadline = time.monotonic() + 60
        while min(len(acked[kind]) for kind in ("insert", "update", "ingest", "ctas")) < 3:
            assert time.monotonic() < deadline, dict(acked)
            time.sleep(0.05)
        server.process.kill()  # SIGKILL: no shutdown, no checkpoint
        server.process.wait()
        stop.set()
        for writer in writers:
            writer.join(60)
    with ServerProcess(tmp_path, "--log-level", "warning") as restarted:
        with flight_sql.connect(restarted.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("SELECT batch, count(*) FROM log GROUP BY batch")
            inserted = dict(cur.fetchall())
            assert set(acked["insert"]) <= set(inserted) and set(inserted.values()) == {ROWS}
            cur.execute("SELECT batch, count(*) FROM ingested GROUP BY batch")
            ingested = dict(cur.fetchall())
            assert set(acked["ingest"]) <= set(ingested) and set(ingested.values()) == {ROWS}
            cur.execute("SELECT min(v), max(v), count(*) FROM counter")
            low, high, rows = cur.fetchone()
            assert rows == 100 and low == high and len(acked["update"]) <= low <= len(acked["update"]) + 1
            cur.execute("SELECT table_name FROM duckdb_tables() WHERE table_name LIKE 'copy_%'")
            copies = [name for (name,) in cur.fetchall()]
            assert {f"copy_{n}" for n in acked["ctas"]} <= set(copies)
            for name in copies:
                cur.execute(f"SELECT count(*) FROM {name}")
                assert cur.fetchone() == (SOURCE_ROWS,), name
