"""Servers started for one test each, over queries that run on them: limits per query and admission,
metrics, the KV a query's end gives back (a cancel, a time limit), texts tokenized as they are written and
after a restart, a drain at SIGTERM, a refresh served from the host tier."""

from __future__ import annotations

import threading
import time

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
from quail.server.flight_messages import CANCEL_STATUS_CANCELLING

from tests.server.running_queries import (LONG, QUICK, REVIEWS, SHORT_PASSES, TOPICS, cancel_flight_info, flight_info,
                                          health_calls, once_under_way, reading)


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
        running = flight_info(client, half)
        thread, outcome = reading(client, running)
        threading.Event().wait(1.0)
        with pytest.raises(pa.ArrowException, match="RESOURCE_EXHAUSTED:the server is busy"):
            client.do_get(flight_info(client, QUICK).endpoints[0].ticket).read_all()
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
            assert once_under_way(watcher, _scoring(0), "tokens_done") is not None
            cur.adbc_cancel()
            thread.join(60)
            assert failure and "CANCELLED" in str(failure[0])
        _kv_given_back(port)
        client = flight.FlightClient(served.uri)
        info = flight_info(client, generating)
        thread, outcome = reading(client, info)
        with flight_sql.connect(served.uri, autocommit=True) as conn, conn.cursor() as cur:
            assert once_under_way(cur, generating, "tokens_generated") is not None
        assert cancel_flight_info(client, info) == CANCEL_STATUS_CANCELLING
        thread.join(60)
        assert isinstance(outcome[0], flight.FlightCancelledError)
        _kv_given_back(port)


def test_a_query_past_its_time_limit_stops_at_once_and_gives_its_kv_back(tmp_path):
    """--query-timeout stops a scoring query mid-way (DEADLINE_EXCEEDED); once it has ended, none of its KV
    is held. Work DuckDB's interrupt would wait for, in one call of a function of Quail's, stops at its next
    step: a similarity join's (two sides of 60,000 stored embeddings: 3.6e9 cosines, seconds of products)
    at the next block of its products, AI_EMBED's (2,000 texts in one call, over a minute of a decoder's
    passes on a CPU) at the next pass, read directly or through a view."""
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
            cur.execute("CREATE VIEW embedded AS SELECT AI_EMBED(body) AS e FROM texts")
            started = time.monotonic()
            with pytest.raises(adbc_driver_manager.Error, match="time limit"):
                cur.execute("SELECT * FROM embedded")
                cur.fetch_arrow_table()
            assert time.monotonic() - started < 6, "a view's embeddings stop with the statement reading it"


def _vectors(rows: int, dims: int, seed: int) -> pa.Table:
    """`rows` random embeddings of `dims` float32 (a FLOAT[dims] column `v`, beside `id`), in batches a
    Flight message holds."""
    flat = np.random.default_rng(seed).standard_normal((rows, dims), dtype=np.float32)
    table = pa.table({"id": pa.array(range(rows), pa.int64()),
                      "v": pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), dims)})
    return pa.Table.from_batches(table.to_batches(max_chunksize=8_000))


def test_a_table_s_texts_are_tokenized_as_it_is_written_and_again_when_the_server_restarts(tmp_path):
    """An ingest's texts are tokenized as documents on the warming thread (quail_texts_tokens, 0 at start, grows
    by them; quail_texts_warming, the texts it has not reached, back to 0 when it is done); a query over some of
    those rows then tokenizes only its prompt's own parts. A server restarted over the data directory tokenizes the
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
                cur.execute("SELECT id FROM reviews WHERE id < 6 AND "
                            "AI_FILTER(PROMPT('Was the soup cold in {0}?', body))")
                cur.fetch_arrow_table()
                asked = tokens() - documents
                if not restarted:  # a table made by a statement is tokenized as it is written too
                    cur.execute("CREATE TABLE later AS SELECT id, body || ' Later.' AS body FROM reviews")
                    assert settled(documents + asked) - documents - asked > documents / 2
        assert documents > 30 * 10 and asked < documents / 10, (restarted, documents, asked)


def test_sigterm_drains_and_an_interrupted_ingest_leaves_a_whole_table(tmp_path):
    """SIGTERM during a large ingest (3M rows in batches of 50,000, streaming when the signal comes) and a
    long query: the health service turns NOT_SERVING, new calls are refused while the server drains, the
    query ends with its rows or UNAVAILABLE / CANCELLED (its work lets go of the database before it closes),
    the process exits with no error in its log, and after a restart the table is the new one, whole, if the
    client was told the ingest succeeded, else the old one."""
    import signal


    big = pa.table({"id": pa.array(range(3_000_000), pa.int64()),
                    "text": pa.array(["x" * 40] * 3_000_000)})
    log = tmp_path / "server.log"
    with ServerProcess(tmp_path / "data", *SHORT_PASSES, log=log) as served:
        with flight_sql.connect(served.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.adbc_ingest("reviews", REVIEWS, mode="replace")
            cur.adbc_ingest("topics", TOPICS, mode="replace")
            cur.adbc_ingest("big", big.slice(0, 10), mode="create")
        client = flight.FlightClient(served.uri)
        thread, outcome = reading(client, flight_info(client, LONG))
        ingested: list = []


        def ingest() -> None:
            batches = pa.RecordBatchReader.from_batches(big.schema, big.to_batches(max_chunksize=50_000))
            try:
                with flight_sql.connect(served.uri, autocommit=True) as conn, conn.cursor() as cur:
                    cur.adbc_ingest("big", batches, mode="replace")
                    ingested.append("ingested")
            except adbc_driver_manager.Error as err:
                ingested.append(err)


        writer = threading.Thread(target=ingest)
        writer.start()
        channel, _, watch = health_calls(served.uri)
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
        code = served.process.wait(60)
        assert code == 0, (code, log.read_text()[-4000:])
        thread.join(60)
        writer.join(60)
        watcher.join(60)
        channel.close()
        assert not thread.is_alive() and not writer.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], (pa.Table, flight.FlightUnavailableError,
                                                             flight.FlightCancelledError)), outcome
        assert statuses[:2] == [health.SERVING, health.NOT_SERVING], statuses
    assert "ERROR" not in log.read_text() and "Traceback" not in log.read_text(), log.read_text()
    with ServerProcess(tmp_path / "data") as restarted:
        with flight_sql.connect(restarted.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) AS n, max(id) AS top FROM big")
            (row,) = cur.fetch_arrow_table().to_pylist()
    whole = (big.num_rows, big.num_rows - 1) if ingested == ["ingested"] else (10, 9)
    assert (row["n"], row["top"]) == whole, (ingested, row)


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
