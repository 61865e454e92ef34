"""Running queries on a real server process, one for the module: cancelling (CancelFlightInfo, the older
CancelQuery, an ADBC client ending its call: the model work stops), sharing the model (queries share forward
passes), watching them (the quail_queries system table), many clients. Tests that need a server of their own
(limits, metrics, what a query's end gives back, shutdown) are test_server_own.py."""

from __future__ import annotations

import threading
import time

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
import grpc
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from quail.clients.server_process import ServerProcess
from quail.server import health
from quail.server import sql_messages as sql
from quail.server.flight_messages import (CANCEL_STATUS_CANCELLED, CANCEL_STATUS_CANCELLING,
                                          CANCEL_STATUS_NOT_CANCELLABLE)

from tests.server.running_queries import (LONG, QUICK, REVIEWS, SHORT_PASSES, TOPICS, cancel_flight_info, flight_info,
                                          health_calls, once_under_way, progress, reading)


WATCH = "SELECT query FROM quail_queries"
LEFT_S = 30.0  # how long after a test a query it started may still be ending (a cancel stops it at a pass)


def _start_with_tables(server: ServerProcess) -> None:
    server.start()
    with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.adbc_ingest("reviews", REVIEWS, mode="replace")
        cur.adbc_ingest("topics", TOPICS, mode="replace")


def _left_running(uri: str) -> list[str]:
    """The queries quail_queries still lists (but this check) LEFT_S seconds from now, or as soon as none."""
    deadline = time.monotonic() + LEFT_S
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        while True:
            cur.execute(WATCH)
            left = [row["query"] for row in cur.fetch_arrow_table().to_pylist() if row["query"] != WATCH]
            if not left or time.monotonic() > deadline:
                return left
            threading.Event().wait(0.25)


@pytest.fixture(scope="module")
def _shared(tmp_path_factory):
    server = ServerProcess(tmp_path_factory.mktemp("data"), *SHORT_PASSES)
    _start_with_tables(server)
    yield server
    server.stop()


@pytest.fixture
def uri(_shared):
    """The module's server. A test that leaves a query running (one that failed before cancelling its long
    join, or a cancel that did not stop it) errors, and the server starts afresh for the tests after it,
    which would otherwise wait behind minutes of model work."""
    yield _shared.uri
    left = _left_running(_shared.uri)
    if left:
        _shared.stop()
        _start_with_tables(_shared)
        pytest.fail(f"queries still running {LEFT_S:.0f} s after the test: {left}")


def _answers_quickly(uri: str) -> None:
    """A small AI query gets the model at once: the cancelled one (minutes of work) no longer holds it."""
    done = threading.Event()

    def run() -> None:
        with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(QUICK)
            if cur.fetch_arrow_table().num_rows <= TOPICS.num_rows:
                done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(60), "the cancelled query still holds the model"


def test_the_grpc_health_service_answers_without_a_login(uri):
    """grpc.health.v1 on the Flight port: SERVING for the server and for Flight, NOT_FOUND (Check) or
    SERVICE_UNKNOWN (Watch) for another name; Watch sends the status now."""
    channel, check, watch = health_calls(uri)
    with channel:
        assert check("") == check("arrow.flight.protocol.FlightService") == health.SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            check("no.such.Service")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert next(watch("")) == health.SERVING
        assert list(watch("no.such.Service")) == [health.SERVICE_UNKNOWN]


def test_cancel_flight_info_stops_a_running_query(uri):
    client = flight.FlightClient(uri)
    info = flight_info(client, LONG)
    thread, outcome = reading(client, info)
    threading.Event().wait(2.0)  # the query is running: its model work has begun
    assert cancel_flight_info(client, info) == CANCEL_STATUS_CANCELLING
    thread.join(60)
    assert not thread.is_alive()
    (err,) = outcome
    assert isinstance(err, flight.FlightCancelledError) and "cancelled" in str(err)
    assert cancel_flight_info(client, info) == CANCEL_STATUS_NOT_CANCELLABLE, "it is over"
    _answers_quickly(uri)


def test_a_prepared_query_runs_from_its_prepare_and_stops_when_closed_unrun(uri):
    """ADBC runs a statement right after preparing it, so a query of no parameters runs from its prepare:
    quail_queries lists the long join under way (its model work planned) before anything executes it;
    closing the statement unrun stops its model work and its entry goes. (Not its first pass done: a head
    start no DoGet takes up stops after 2 s, and on a loaded machine a pass can take longer.)"""
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as watcher:
        with conn.cursor() as cur:
            cur.adbc_prepare(LONG)
            assert once_under_way(watcher, LONG, "tokens_planned") is not None, "under way before its DoGet"
        for _ in range(240):
            if progress(watcher, LONG) is None:
                break
            threading.Event().wait(0.25)
        assert progress(watcher, LONG) is None, "closed unrun: stopped"
    _answers_quickly(uri)


def test_queries_share_passes_and_show_their_progress(uri):
    """While a long AI query runs, quail_queries shows its progress, and a short AI query sent after it
    is answered while the long one still runs: it cuts into the long one's pass, or joins the next."""
    client = flight.FlightClient(uri)
    info = flight_info(client, LONG)
    thread, outcome = reading(client, info)
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        started = once_under_way(cur, LONG, "tokens_done")
        assert started is not None and started["requests"] == REVIEWS.num_rows * TOPICS.num_rows
        assert 0 < started["tokens_done"] < started["tokens_planned"] and started["user_name"] == "-"
        assert started["queue_place"] == 1 and started["tokens_cached"] > 0, "its anchors are computed once"
        cur.execute(QUICK)
        assert cur.fetch_arrow_table().num_rows <= TOPICS.num_rows
        assert thread.is_alive(), "the short query was answered while the long one ran"
        later = once_under_way(cur, LONG, "tokens_done", started["tokens_done"])
        assert later is not None and later["query_id"] == started["query_id"]
        assert later["elapsed_s"] > started["elapsed_s"]
        watching = progress(cur, "SELECT * FROM quail_queries")
        assert watching is not None and watching["tokens_planned"] == 0, "a query sees itself, no model work"
        assert watching["queue_place"] is None
    assert cancel_flight_info(client, info) == CANCEL_STATUS_CANCELLING
    thread.join(60)
    assert not thread.is_alive() and isinstance(outcome[0], flight.FlightCancelledError)


def test_a_generating_query_shows_its_tokens_and_a_cancel_stops_its_decoding(uri):
    """AI_COMPLETE over 48 reviews, 256 tokens each: quail_queries shows the tokens generated so far, and a
    cancel stops the decoding at the next pass."""
    generating = ("SELECT id, AI_COMPLETE(PROMPT('Reply to {0} at length.', body), {'max_tokens': 256}) AS reply "
                  "FROM reviews WHERE id < 48")
    client = flight.FlightClient(uri)
    info = flight_info(client, generating)
    thread, outcome = reading(client, info)
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        assert once_under_way(cur, generating, "tokens_generated") is not None
    assert cancel_flight_info(client, info) == CANCEL_STATUS_CANCELLING
    thread.join(30)
    assert not thread.is_alive() and isinstance(outcome[0], flight.FlightCancelledError)
    _answers_quickly(uri)


def test_ai_rows_stream_before_the_query_ends(uri):
    """An AI projection over 100 rows: the client holds the first chunk's rows while the query still
    runs (quail_queries lists it), then the rest arrive, in table order."""
    from quail.engine.runtime.estimates import CHUNK_ROWS

    notes = pa.table({"id": list(range(100)), "body": [f"Note {i}." for i in range(100)]})  # short: fewer tokens
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.adbc_ingest("notes", notes, mode="replace")
    query = "SELECT id, AI_FILTER(PROMPT('Is {0} about food?', body)) AS food FROM notes"
    client = flight.FlightClient(uri)
    reader = client.do_get(flight_info(client, query).endpoints[0].ticket)
    first = reader.read_chunk().data
    assert first.num_rows == CHUNK_ROWS[0]
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        assert progress(cur, query) is not None, "the first rows left before the query finished"
    rest = reader.read_all()
    assert first.column("id").to_pylist() + rest.column("id").to_pylist() == list(range(100))


def test_system_tables_are_listed_and_read_only(uri):
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        assert "SYSTEM TABLE" in conn.adbc_get_table_types()
        listed = conn.adbc_get_objects(table_types_filter=["SYSTEM TABLE"]).read_all().to_pylist()
        tables = listed[0]["catalog_db_schemas"][0]["db_schema_tables"]
        assert [(t["table_name"], t["table_type"]) for t in tables] == [("quail_queries", "SYSTEM TABLE")]
        assert conn.adbc_get_table_schema("quail_queries").names[:3] == ["query_id", "user_name", "query"]
        for statement in ("DROP TABLE quail_queries", "INSERT INTO quail_queries SELECT * FROM quail_queries",
                          "CREATE TABLE quail_queries AS SELECT 1 AS x"):
            with pytest.raises(adbc_driver_manager.Error, match="system table") as info:
                cur.execute(statement)
                cur.fetch_arrow_table()
            assert info.value.vendor_code == 3, "gRPC INVALID_ARGUMENT"
        with pytest.raises(adbc_driver_manager.Error, match="system table"):
            cur.adbc_ingest("quail_queries", TOPICS, mode="append")


def test_a_query_cancelled_before_its_ticket_is_redeemed_never_runs(uri):
    client = flight.FlightClient(uri)
    info = flight_info(client, LONG)
    body = sql.pack(sql.new("ActionCancelQueryRequest", info=info.serialize()))
    (result,) = client.do_action(flight.Action("CancelQuery", body))
    _, answer = sql.unpack(result.body.to_pybytes())
    assert answer.result == CANCEL_STATUS_CANCELLED
    with pytest.raises(flight.FlightError, match="cancelled"):
        client.do_get(info.endpoints[0].ticket).read_all()


def test_an_adbc_client_cancelling_its_call_stops_the_query(uri):
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        failure: list = []

        def run() -> None:
            try:
                cur.execute(LONG)
                cur.fetch_arrow_table()
            except adbc_driver_manager.Error as err:
                failure.append(err)

        thread = threading.Thread(target=run)
        thread.start()
        threading.Event().wait(2.0)
        cur.adbc_cancel()
        thread.join(60)
        assert not thread.is_alive() and failure
    _answers_quickly(uri)


def test_sixteen_clients_at_once(uri):
    """Mixed AI and plain queries from 16 connections at the same time: all answered, right rows."""
    import concurrent.futures

    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(QUICK)
        ai_rows = cur.fetch_arrow_table().to_pylist()

    def client(k: int) -> bool:
        with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            if k % 2:
                cur.execute(QUICK)
                return cur.fetch_arrow_table().to_pylist() == ai_rows
            cur.execute(f"SELECT count(*) AS n FROM reviews WHERE id % 16 = {k}")
            return cur.fetch_arrow_table().to_pylist() == [{"n": len(range(k, 600, 16))}]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert all(pool.map(client, range(16)))


def test_an_ingest_cut_off_by_its_client_writes_nothing(uri):
    """A client process dies in the middle of a replacing ingest: the table keeps its old rows."""
    import subprocess
    import sys

    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.adbc_ingest("kept", TOPICS, mode="replace")
    script = f"""
import os, pyarrow as pa, pyarrow.flight as flight
from quail.server import sql_messages as sql
client = flight.FlightClient({uri!r})
command = sql.pack(sql.new("CommandStatementIngest", table="kept", table_definition_options=sql.new(
    "TableDefinitionOptions", if_not_exist=sql.TABLE_NOT_EXIST_CREATE, if_exists=sql.TABLE_EXISTS_REPLACE)))
batch = pa.record_batch({{"id": list(range(1000)), "topic": ["x"] * 1000}})
writer, _ = client.do_put(flight.FlightDescriptor.for_command(command), batch.schema)
for _ in range(20):
    writer.write_batch(batch)
os._exit(1)  # no end of stream
"""
    assert subprocess.run([sys.executable, "-c", script], timeout=60).returncode == 1
    threading.Event().wait(1.0)
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) AS n FROM kept")
        assert cur.fetch_arrow_table().to_pylist() == [{"n": TOPICS.num_rows}]
SHARED_ROWS = 5  # each statement's
SHARED = [f"SELECT id, AI_SCORE(PROMPT('Is {{0}} {word}?', body)) AS p, AI_FILTER(PROMPT('Does {{0}} mention "
          f"the staff?', body)) AS staff FROM reviews WHERE id BETWEEN {k} AND {k + SHARED_ROWS - 1} ORDER BY id"
          for k, word in [(0, "kind"), (40, "angry"), (80, "about food"), (120, "short"), (160, "polite"),
                          (200, "about money")]]


def test_concurrent_clients_get_the_answers_they_get_one_at_a_time(uri):
    """Six clients at once, their statements' rows in shared passes: the same yes / no answers, and scores
    within 1e-4, as each statement sent alone."""
    def rows(query: str) -> list[tuple]:
        with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(query)
            return [tuple(r.values()) for r in cur.fetch_arrow_table().to_pylist()]

    alone = [rows(query) for query in SHARED]
    together: dict[int, list[tuple]] = {}
    threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, rows(SHARED[i])))
               for i in range(len(SHARED))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert sorted(together) == list(range(len(SHARED)))
    for i, want in enumerate(alone):
        got = together[i]
        assert [(r[0], r[2]) for r in got] == [(r[0], r[2]) for r in want] and len(want) == SHARED_ROWS, SHARED[i]
        assert all(abs(a[1] - b[1]) < 1e-4 for a, b in zip(got, want)), SHARED[i]
