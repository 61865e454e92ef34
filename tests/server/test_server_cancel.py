"""Running queries on a real server process: cancelling (CancelFlightInfo, the older CancelQuery, an
ADBC client ending its call: the model work stops), sharing the model (queries share forward passes),
watching them (the quail_queries system table), limits, metrics, many clients, shutdown."""

from __future__ import annotations

import threading
import time
from typing import Callable

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
import grpc
import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from quail.clients.server_process import ServerProcess, free_port, metric_samples
from quail.engine.model.embedded import embedded_gguf
from quail.server import health
from quail.server import sql_messages as sql
from quail.server.flight_messages import (CANCEL_STATUS_CANCELLED, CANCEL_STATUS_CANCELLING,
                                          CANCEL_STATUS_NOT_CANCELLABLE, FLIGHT)

REVIEWS = pa.table({"id": list(range(600)),
                    "body": [f"Review {i}: the soup was {'cold' if i % 2 else 'hot'} and the staff "
                             f"{'rude' if i % 3 else 'kind'}; we paid {i % 40 + 10} euros." for i in range(600)]})
TOPICS = pa.table({"id": list(range(12)), "topic": ["food", "service", "price", "noise", "a film", "weather",
                                                    "a car", "music", "sports", "travel", "books", "health"]})
LONG = ("SELECT r.id, t.id FROM reviews r JOIN topics t "
        "ON AI_FILTER(PROMPT('Is the review {0} about {1}?', r.body, t.topic))")  # 7,200 model requests
QUICK = "SELECT id FROM topics WHERE AI_FILTER(PROMPT('Is {0} about food?', topic)) ORDER BY id"
# Passes of 512 tokens (about a second on a CPU core; 1,024, the default, about two): a query sent
# while the long one runs joins it at the next pass, and a cancel or a time limit stops it there.
SHORT_PASSES = ("--token-budget", "512")


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


def _info(client: flight.FlightClient, query: str) -> flight.FlightInfo:
    command = sql.pack(sql.new("CommandStatementQuery", query=query))
    return client.get_flight_info(flight.FlightDescriptor.for_command(command))


def _reading(client: flight.FlightClient, info: flight.FlightInfo) -> tuple[threading.Thread, list]:
    outcome: list = []

    def read() -> None:
        try:
            outcome.append(client.do_get(info.endpoints[0].ticket).read_all())
        except flight.FlightError as err:
            outcome.append(err)

    thread = threading.Thread(target=read)
    thread.start()
    return thread, outcome


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


def _health(uri: str) -> tuple[grpc.Channel, Callable, Callable]:
    """A channel to the server's health service, and its Check and Watch calls (service name in, statuses out)."""
    channel = grpc.insecure_channel(uri.removeprefix("grpc://"))
    request, response = health.MESSAGES["HealthCheckRequest"], health.MESSAGES["HealthCheckResponse"]
    check = channel.unary_unary(f"/{health.SERVICE}/Check", request.SerializeToString, response.FromString)
    watch = channel.unary_stream(f"/{health.SERVICE}/Watch", request.SerializeToString, response.FromString)
    return channel, lambda name: check(request(service=name), timeout=10).status, \
        lambda name: (reply.status for reply in watch(request(service=name), timeout=60))


def test_the_grpc_health_service_answers_without_a_login(uri):
    """grpc.health.v1 on the Flight port: SERVING for the server and for Flight, NOT_FOUND (Check) or
    SERVICE_UNKNOWN (Watch) for another name; Watch sends the status now."""
    channel, check, watch = _health(uri)
    with channel:
        assert check("") == check("arrow.flight.protocol.FlightService") == health.SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            check("no.such.Service")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert next(watch("")) == health.SERVING
        assert list(watch("no.such.Service")) == [health.SERVICE_UNKNOWN]


def _cancel_flight_info(client: flight.FlightClient, info: flight.FlightInfo) -> int:
    parsed = FLIGHT["FlightInfo"]()
    parsed.ParseFromString(info.serialize())
    body = FLIGHT["CancelFlightInfoRequest"](info=parsed).SerializeToString()
    (result,) = client.do_action(flight.Action("CancelFlightInfo", body))
    status = FLIGHT["CancelFlightInfoResult"]()
    status.ParseFromString(result.body.to_pybytes())
    return status.status


def test_cancel_flight_info_stops_a_running_query(uri):
    client = flight.FlightClient(uri)
    info = _info(client, LONG)
    thread, outcome = _reading(client, info)
    threading.Event().wait(2.0)  # the query is running: its model work has begun
    assert _cancel_flight_info(client, info) == CANCEL_STATUS_CANCELLING
    thread.join(60)
    assert not thread.is_alive()
    (err,) = outcome
    assert isinstance(err, flight.FlightCancelledError) and "cancelled" in str(err)
    assert _cancel_flight_info(client, info) == CANCEL_STATUS_NOT_CANCELLABLE, "it is over"
    _answers_quickly(uri)


def _progress(cur, query: str) -> dict | None:
    cur.execute("SELECT * FROM quail_queries")
    return next((row for row in cur.fetch_arrow_table().to_pylist() if row["query"] == query), None)


def _once_under_way(cur, query: str, column: str, above: int = 0) -> dict | None:
    """The query's quail_queries row once its `column` is above `above` (None: not within a minute)."""
    for _ in range(240):
        row = _progress(cur, query)
        if row is not None and row[column] > above:
            return row
        threading.Event().wait(0.25)
    return None


def test_a_prepared_query_runs_from_its_prepare_and_stops_when_closed_unrun(uri):
    """ADBC runs a statement right after preparing it, so a query of no parameters runs from its prepare:
    quail_queries lists the long join under way before anything executes it; closing the statement unrun
    stops its model work and its entry goes."""
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as watcher:
        with conn.cursor() as cur:
            cur.adbc_prepare(LONG)
            assert _once_under_way(watcher, LONG, "tokens_done") is not None, "under way before its DoGet"
        for _ in range(240):
            if _progress(watcher, LONG) is None:
                break
            threading.Event().wait(0.25)
        assert _progress(watcher, LONG) is None, "closed unrun: stopped"
    _answers_quickly(uri)


def test_queries_share_passes_and_show_their_progress(uri):
    """While a long AI query runs, quail_queries shows its progress, and a short AI query sent after it
    is answered while the long one still runs: it cuts into the long one's pass, or joins the next."""
    client = flight.FlightClient(uri)
    info = _info(client, LONG)
    thread, outcome = _reading(client, info)
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        started = _once_under_way(cur, LONG, "tokens_done")
        assert started is not None and started["requests"] == REVIEWS.num_rows * TOPICS.num_rows
        assert 0 < started["tokens_done"] < started["tokens_planned"] and started["user_name"] == "-"
        assert started["queue_place"] == 1 and started["tokens_cached"] > 0, "its anchors are computed once"
        cur.execute(QUICK)
        assert cur.fetch_arrow_table().num_rows <= TOPICS.num_rows
        assert thread.is_alive(), "the short query was answered while the long one ran"
        later = _once_under_way(cur, LONG, "tokens_done", started["tokens_done"])
        assert later is not None and later["query_id"] == started["query_id"]
        assert later["elapsed_s"] > started["elapsed_s"]
        watching = _progress(cur, "SELECT * FROM quail_queries")
        assert watching is not None and watching["tokens_planned"] == 0, "a query sees itself, no model work"
        assert watching["queue_place"] is None
    assert _cancel_flight_info(client, info) == CANCEL_STATUS_CANCELLING
    thread.join(60)
    assert not thread.is_alive() and isinstance(outcome[0], flight.FlightCancelledError)


def test_a_generating_query_shows_its_tokens_and_a_cancel_stops_its_decoding(uri):
    """AI_COMPLETE over 48 reviews, 256 tokens each: quail_queries shows the tokens generated so far, and a
    cancel stops the decoding at the next pass."""
    generating = ("SELECT id, AI_COMPLETE(PROMPT('Reply to {0} at length.', body), {'max_tokens': 256}) AS reply "
                  "FROM reviews WHERE id < 48")
    client = flight.FlightClient(uri)
    info = _info(client, generating)
    thread, outcome = _reading(client, info)
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        assert _once_under_way(cur, generating, "tokens_generated") is not None
    assert _cancel_flight_info(client, info) == CANCEL_STATUS_CANCELLING
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
    reader = client.do_get(_info(client, query).endpoints[0].ticket)
    first = reader.read_chunk().data
    assert first.num_rows == CHUNK_ROWS[0]
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        assert _progress(cur, query) is not None, "the first rows left before the query finished"
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
    info = _info(client, LONG)
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


def test_limits_per_query_and_admission(tmp_path):
    """--max-requests refuses a query asking more (RESOURCE_EXHAUSTED), --query-timeout stops a long
    one (DEADLINE_EXCEEDED), --max-active refuses a query past the running ones (RESOURCE_EXHAUSTED)."""

    args = ("--max-requests", "5000", "--query-timeout", "3", "--max-active", "1", *SHORT_PASSES)
    with ServerProcess(tmp_path, *args) as limited:
        with flight_sql.connect(limited.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.adbc_ingest("reviews", REVIEWS, mode="replace")
            cur.adbc_ingest("topics", TOPICS, mode="replace")
            with pytest.raises(adbc_driver_manager.Error, match="more than 5000 times") as info:
                cur.execute(LONG)
                cur.fetch_arrow_table()
            assert info.value.vendor_code == 8, "gRPC RESOURCE_EXHAUSTED"
            half = LONG + " WHERE r.id < 400"  # 4,800 requests: allowed, but minutes of work
            with pytest.raises(adbc_driver_manager.Error, match="time limit") as info:
                cur.execute(half)
                cur.fetch_arrow_table()
            assert info.value.status_code == adbc_driver_manager.AdbcStatusCode.TIMEOUT
            assert info.value.vendor_code == 4, "gRPC DEADLINE_EXCEEDED"
        client = flight.FlightClient(limited.uri)
        running = _info(client, half)
        thread, outcome = _reading(client, running)
        threading.Event().wait(1.0)
        with pytest.raises(pa.ArrowException, match="RESOURCE_EXHAUSTED:the server is busy"):
            client.do_get(_info(client, QUICK).endpoints[0].ticket).read_all()
        thread.join(60)
        assert isinstance(outcome[0], flight.FlightTimedOutError), "the running query hit its time limit"


def test_prometheus_metrics(tmp_path):
    """--metrics-port: queries by status, model tokens by kind (generated too) and decode steps, errors by status,
    speed-of-light fractions, the device's busy seconds, the KV pool and the resident tree's counters."""
    port = free_port()
    with ServerProcess(tmp_path, "--metrics-port", str(port)) as served:
        began = time.monotonic()
        with flight_sql.connect(served.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.adbc_ingest("topics", TOPICS, mode="replace")
            cur.execute(QUICK)
            cur.fetch_arrow_table()
            cur.execute("SELECT id, AI_FILTER(PROMPT('Is {0} about food?', topic)) AS food, "
                        "AI_FILTER(PROMPT('Is {0} fun?', topic)) AS fun FROM topics")
            cur.fetch_arrow_table()  # the topics' KV stays in the pool for later queries
            cur.execute(QUICK)  # again: served from the pool but each answer cue
            cur.fetch_arrow_table()
            cur.execute("SELECT AI_COMPLETE(PROMPT('Name {0} in a word.', topic), {'max_tokens': 3}) FROM topics "
                        "WHERE id < 2")
            cur.fetch_arrow_table()
            with pytest.raises(adbc_driver_manager.Error):
                cur.execute("SELECT * FROM no_such_table")
        _kv_given_back(port)  # the last query's thread may still be ending as its answers leave
        values = metric_samples(f"http://127.0.0.1:{port}/metrics", timeout=10)
        wall = time.monotonic() - began
    assert values['quail_queries_total{status="OK"}'] >= 1
    assert 0 < values["quail_device_busy_seconds_total"] < wall, "the passes' seconds, within the queries' time"
    assert values['quail_tokens_total{kind="fresh"}'] > 0 and values['quail_tokens_total{kind="logical"}'] > 0
    assert values['quail_errors_total{status="NOT_FOUND"}'] == 1
    assert values['quail_tokens_total{kind="generated"}'] >= 2 and values["quail_decode_steps_total"] >= 1
    assert values["quail_query_sol_fraction_count"] >= 1 and values["quail_queries_running"] == 0
    assert values["quail_queries_waiting"] == 0 and values["quail_kv_resident_bytes"] == 0, "all freed"
    assert values["quail_kv_cached_bytes"] > 0, "the prompts computed stay for later queries"
    assert 0 < values["quail_kv_cached_bytes"] <= values["quail_kv_pool_used_bytes"] <= values["quail_kv_pool_bytes"]
    assert 0 < values["quail_kv_hit_tokens_total"] < values["quail_kv_looked_up_tokens_total"]
    assert values["quail_kv_inserted_tokens_total"] > 0 and values["quail_kv_evicted_tokens_total"] == 0


def _scoring(first: int) -> str:
    return f"SELECT id, AI_SCORE(PROMPT('Is {{0}} kind?', body)) AS p FROM reviews WHERE id >= {first}"


def _kv_given_back(port: int) -> None:
    """Once no query runs: no KV held for a running query, and the pool holds only what the resident tree
    keeps for later ones. (A query's thread may still be unwinding its error as its call ends.)"""
    values: dict[str, float] = {}
    for _ in range(100):
        values = metric_samples(f"http://127.0.0.1:{port}/metrics", timeout=10)
        if values["quail_queries_running"] == values["quail_kv_resident_bytes"] == 0:
            break
        threading.Event().wait(0.1)
    assert values["quail_queries_running"] == 0 and values["quail_kv_resident_bytes"] == 0, values
    assert 0 < values["quail_kv_cached_bytes"] == values["quail_kv_pool_used_bytes"], values


def test_a_cancelled_query_gives_its_kv_back_at_once(tmp_path):
    """Queries cancelled while their passes run (scoring, by the ADBC client; generating, by
    CancelFlightInfo) hold no KV once they have ended: the error a query ends with keeps nothing of its work
    alive until a garbage collection."""
    port = free_port()
    generating = ("SELECT id, AI_COMPLETE(PROMPT('Reply to {0} at length.', body), {'max_tokens': 256}) AS reply "
                  "FROM reviews WHERE id < 48")
    with ServerProcess(tmp_path, "--metrics-port", str(port), *SHORT_PASSES) as served:
        with flight_sql.connect(served.uri, autocommit=True) as conn, conn.cursor() as cur, \
                conn.cursor() as watcher:
            cur.adbc_ingest("reviews", REVIEWS, mode="replace")
            failure: list = []

            def run() -> None:
                try:
                    cur.execute(_scoring(0))
                    cur.fetch_arrow_table()
                except adbc_driver_manager.Error as err:
                    failure.append(err)

            thread = threading.Thread(target=run)
            thread.start()
            assert _once_under_way(watcher, _scoring(0), "tokens_done") is not None
            cur.adbc_cancel()
            thread.join(60)
            assert failure and "CANCELLED" in str(failure[0])
        _kv_given_back(port)
        client = flight.FlightClient(served.uri)
        info = _info(client, generating)
        thread, outcome = _reading(client, info)
        with flight_sql.connect(served.uri, autocommit=True) as conn, conn.cursor() as cur:
            assert _once_under_way(cur, generating, "tokens_generated") is not None
        assert _cancel_flight_info(client, info) == CANCEL_STATUS_CANCELLING
        thread.join(60)
        assert isinstance(outcome[0], flight.FlightCancelledError)
        _kv_given_back(port)


def test_a_query_past_its_time_limit_stops_at_once_and_gives_its_kv_back(tmp_path):
    """--query-timeout stops a scoring query mid-way (DEADLINE_EXCEEDED); once it has ended, none of its KV
    is held. Work DuckDB's interrupt would wait for, in one call of a function of Quail's, stops at its next
    step: a similarity join's (two sides of 60,000 stored embeddings: 3.6e9 cosines, seconds of products)
    at the next block of its products, AI_EMBED's (2,000 texts in one call, over a minute of a decoder's
    passes on a CPU) at the next pass."""
    port = free_port()
    with ServerProcess(tmp_path, "--metrics-port", str(port), "--query-timeout", "2", *SHORT_PASSES,
                       "--embed-model", str(embedded_gguf())) as served:
        with flight_sql.connect(served.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.adbc_ingest("reviews", REVIEWS, mode="replace")
            with pytest.raises(adbc_driver_manager.Error, match="time limit"):
                cur.execute(_scoring(0))
                cur.fetch_arrow_table()
        _kv_given_back(port)
        with flight_sql.connect(served.uri, autocommit=True) as conn, conn.cursor() as cur:
            for name, seed in (("va", 1), ("vb", 2)):
                cur.adbc_ingest(name, _vectors(60_000, 256, seed), mode="create")
            started = time.monotonic()
            with pytest.raises(adbc_driver_manager.Error, match="time limit"):
                cur.execute("SELECT a.id, b.id FROM va a JOIN vb b ON AI_SIMILARITY(a.v, b.v) > 0.5")
                cur.fetch_arrow_table()
            assert time.monotonic() - started < 6, "a bound, not a timing: the products take 15 s and more"
            cur.execute("SELECT count(*) FROM va")
            assert cur.fetchall() == [(60_000,)], "the server answers on"
            cur.adbc_ingest("texts", pa.table({"body": [f"text {k}: " + "some words " * 8 for k in range(2000)]}),
                            mode="create")
            started = time.monotonic()
            with pytest.raises(adbc_driver_manager.Error, match="time limit"):
                cur.execute("SELECT AI_EMBED(body) AS e FROM texts")
                cur.fetch_arrow_table()
            assert time.monotonic() - started < 6, "a bound, not a timing: the passes take over a minute"


def _vectors(rows: int, dims: int, seed: int) -> pa.Table:
    """`rows` random embeddings of `dims` float32 (a FLOAT[dims] column `v`, beside `id`), in batches a
    Flight message holds."""
    flat = np.random.default_rng(seed).standard_normal((rows, dims), dtype=np.float32)
    table = pa.table({"id": pa.array(range(rows), pa.int64()),
                      "v": pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), dims)})
    return pa.Table.from_batches(table.to_batches(max_chunksize=8_000))


def test_a_table_s_texts_are_tokenized_as_it_is_written_and_again_when_the_server_restarts(tmp_path):
    """An ingest's texts are tokenized as documents on the warming thread (quail_texts_tokens, 0 at start, grows
    by them; quail_texts_warming, the texts it has not reached, back to 0 when it is done); a query over those
    rows then tokenizes only its prompt's own parts. A server restarted over the data directory tokenizes the
    tables it kept."""
    port = free_port()

    def metric(name: str) -> float:
        return metric_samples(f"http://127.0.0.1:{port}/metrics", timeout=10)[name]

    def tokens() -> float:
        return metric("quail_texts_tokens")

    def settled(since: float = 0.0) -> float:
        """quail_texts_tokens once the warming thread is done, which it is only once they are above `since`."""
        deadline = time.monotonic() + 60
        while metric("quail_texts_warming") > 0:
            assert time.monotonic() < deadline, "the texts were not tokenized"
            time.sleep(0.05)
        assert tokens() > since
        return tokens()

    for restarted in (False, True):
        with ServerProcess(tmp_path, "--metrics-port", str(port)) as served:
            with flight_sql.connect(served.uri, autocommit=True) as conn, conn.cursor() as cur:
                if not restarted:
                    assert tokens() == 0
                    cur.adbc_ingest("reviews", REVIEWS.slice(0, 30), mode="create")
                documents = settled()
                cur.execute("SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Was the soup cold in {0}?', body))")
                cur.fetch_arrow_table()
                asked = tokens() - documents
                if not restarted:  # a table made by a statement is tokenized as it is written too
                    cur.execute("CREATE TABLE later AS SELECT id, body || ' Later.' AS body FROM reviews")
                    assert settled(documents + asked) - documents - asked > documents / 2
        assert documents > 30 * 10 and asked < documents / 10, (restarted, documents, asked)


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


def test_sigterm_drains_and_an_interrupted_ingest_leaves_a_whole_table(tmp_path):
    """SIGTERM during a large ingest and a long query: the health service turns NOT_SERVING, new calls are
    refused while the server drains, the process exits, and after a restart the table is either the old
    one or the new one, whole."""
    import signal


    big = pa.table({"id": pa.array(range(3_000_000), pa.int64()),
                    "text": pa.array(["x" * 40] * 3_000_000)})
    with ServerProcess(tmp_path, *SHORT_PASSES) as served:
        with flight_sql.connect(served.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.adbc_ingest("reviews", REVIEWS, mode="replace")
            cur.adbc_ingest("topics", TOPICS, mode="replace")
            cur.adbc_ingest("big", big.slice(0, 10), mode="create")
        client = flight.FlightClient(served.uri)
        thread, outcome = _reading(client, _info(client, LONG))

        def ingest() -> None:
            try:
                with flight_sql.connect(served.uri, autocommit=True) as conn, conn.cursor() as cur:
                    cur.adbc_ingest("big", big, mode="replace")
                    outcome.append("ingested")
            except adbc_driver_manager.Error as err:
                outcome.append(err)

        writer = threading.Thread(target=ingest)
        writer.start()
        channel, _, watch = _health(served.uri)
        statuses: list[int] = []

        def watching() -> None:
            try:
                statuses.extend(watch(""))
            except grpc.RpcError:
                pass  # the stream ends with the server

        watcher = threading.Thread(target=watching)
        watcher.start()
        threading.Event().wait(0.5)
        served.process.send_signal(signal.SIGTERM)
        refused = None
        for _ in range(100):  # the signal is handled within moments (longer on a loaded machine)
            try:
                client.get_flight_info(flight.FlightDescriptor.for_command(
                    sql.pack(sql.new("CommandStatementQuery", query="SELECT 1"))))
            except (flight.FlightUnavailableError, flight.FlightCancelledError) as err:
                refused = err  # UNAVAILABLE; CANCELLED for a call that raced gRPC's own shutdown
                break
            threading.Event().wait(0.1)
        assert refused is not None, "new calls are refused while the server drains"
        assert served.process.wait(60) == 0
        thread.join(60)
        writer.join(60)
        watcher.join(60)
        channel.close()
        assert not thread.is_alive() and not writer.is_alive()
        assert statuses[:2] == [health.SERVING, health.NOT_SERVING], statuses
    with ServerProcess(tmp_path) as restarted:
        with flight_sql.connect(restarted.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) AS n, max(id) AS top FROM big")
            (row,) = cur.fetch_arrow_table().to_pylist()
    assert (row["n"], row["top"]) in {(10, 9), (big.num_rows, big.num_rows - 1)}


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


SHARED_ROWS = 10  # each statement's
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


def test_kv_the_pool_has_no_room_for_waits_in_host_memory_and_serves_a_refresh(tmp_path):
    """--kv-host-bytes beside a pool of 600 tokens: a query over more documents than that moves the pool's
    oldest to host memory; the same query sent again (a dashboard's refresh) copies them back instead of
    computing them (it computes only each prompt's last tokens), returns the same rows, and the metrics
    show both moves."""
    port = free_port()

    def metrics() -> dict[str, float]:
        return metric_samples(f"http://127.0.0.1:{port}/metrics", timeout=10)

    per_token = 46_080  # SmolLM2-135M in fp32: 2 × 30 layers × 3 KV heads × 64 × 4 bytes
    query = ("SELECT id, AI_FILTER(PROMPT('Was the soup cold in {0}?', body)) AS cold FROM reviews WHERE id < 60 "
             "ORDER BY id")
    fresh = 'quail_tokens_total{kind="fresh"}'
    with ServerProcess(tmp_path, "--metrics-port", str(port), "--token-budget", "256",
                       "--kv-cache-bytes", str(600 * per_token), "--kv-host-bytes", str(4000 * per_token)) as served:
        with flight_sql.connect(served.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.adbc_ingest("reviews", REVIEWS.slice(0, 60), mode="replace")
            cur.execute(query)
            first = cur.fetch_arrow_table()
            before = metrics()
            cur.execute(query)
            assert cur.fetch_arrow_table().equals(first)
        after = metrics()
    assert after["quail_kv_pool_bytes"] <= 600 * per_token and after["quail_kv_host_bytes"] == 4000 * per_token
    assert before["quail_kv_host_offloaded_tokens_total"] > 1000, "more documents than the pool holds"
    assert after["quail_kv_host_restored_tokens_total"] > 1000, "the refresh copied them back"
    assert after[fresh] - before[fresh] < before[fresh] / 4, "and computed little"
    assert 0 < after["quail_kv_host_used_bytes"] <= after["quail_kv_host_bytes"]
