"""Work that cannot be served is refused up front, and no request holds the server: a real server process.

Prompts longer than the model's context are refused before any forward pass;
long prompts run in passes of at most the token budget, so a timeout or a
cancel stops them within one; DuckDB work is interrupted by both; a malformed
stream or an unknown token does not wedge a call or the shutdown.
"""

from __future__ import annotations

import signal
import threading
import time

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
import grpc
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from quail.clients.server_process import ServerProcess
from quail.server import sql_messages as sql

TIMEOUT_S = 4
QUESTION = "SELECT id FROM docs WHERE AI_FILTER(PROMPT('Is {0} about cats?', body)) ORDER BY id"


def _words(n: int) -> str:
    return " ".join(f"cat{i}" for i in range(n))


DOCS = pa.table({"id": [1, 2, 3], "body": ["A short note about cats.", _words(1600), _words(6000)]})
NUMBERS = pa.table({"x": pa.array(range(200_000), pa.int64())})
HEAVY = "SELECT count(*) AS n FROM numbers a, numbers b WHERE (a.x * b.x) % 7 = 3"  # 4e10 pairs: hours


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """A server whose queries may run TIMEOUT_S seconds, in passes of at most 512 tokens, and generate at most
    8 tokens each (so a generation test passes its limit in two decode steps, well within the time limit on a
    busy machine)."""
    args = ("--query-timeout", str(TIMEOUT_S), "--token-budget", "512", "--max-active", "2",
            "--max-generated-tokens", "8")
    with ServerProcess(tmp_path_factory.mktemp("limited"), *args) as server:
        with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.adbc_ingest("docs", DOCS, mode="create")
            cur.adbc_ingest("numbers", NUMBERS, mode="create")
        yield server


def _run(uri: str, query: str) -> list[tuple]:
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(query)
        return cur.fetchall()


def _within(seconds: float, fn, *args):
    """fn's outcome (its result, or the error it raised), or a failure when it takes longer than `seconds`."""
    outcome: list = []

    def call() -> None:
        try:
            outcome.append(fn(*args))
        except Exception as err:  # noqa: BLE001 - the outcome is what the test looks at
            outcome.append(err)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still running after {seconds} s"
    return outcome[0]


def test_a_prompt_longer_than_the_context_is_refused_before_any_pass(limited):
    error = _within(30, _run, limited.uri, QUESTION)
    assert isinstance(error, adbc_driver_manager.Error) and str(error).startswith("INVALID_ARGUMENT"), error
    assert "reads at most 8,192" in str(error) and "a text beginning 'cat0 cat1" in str(error)
    assert _run(limited.uri, "SELECT count(*) FROM docs") == [(3,)], "the server keeps answering"


def test_a_timeout_stops_a_long_prompt_within_a_pass_of_the_budget(limited):
    """Document 2 is ~6,900 tokens (a minute of passes on two cores): at 512 a pass, the time limit stops it
    after at most one more pass, seconds after the limit."""
    started = time.monotonic()
    error = _within(120, _run, limited.uri, QUESTION.replace("ORDER BY", "AND id = 2 ORDER BY"))
    assert isinstance(error, adbc_driver_manager.Error) and "time limit" in str(error), error
    assert time.monotonic() - started < TIMEOUT_S + 10
    assert _within(60, _run, limited.uri, QUESTION.replace("ORDER BY", "AND id = 1 ORDER BY")) in ([], [(1,)])


def test_duckdb_work_stops_at_the_timeout_and_at_a_cancel(limited):
    started = time.monotonic()
    error = _within(60, _run, limited.uri, HEAVY)
    assert isinstance(error, adbc_driver_manager.Error) and "time limit" in str(error), error
    assert error.vendor_code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert time.monotonic() - started < TIMEOUT_S + 10

    def cancelled_after_a_second() -> None:
        with flight_sql.connect(limited.uri, autocommit=True) as conn, conn.cursor() as cur:
            threading.Timer(1.0, cur.adbc_cancel).start()
            cur.execute(HEAVY)
            cur.fetchall()

    error = _within(30, cancelled_after_a_second)
    assert isinstance(error, adbc_driver_manager.Error), error
    time.sleep(1.0)  # the server sees the call end
    for _ in range(2):  # both of --max-active's slots are free again, and nothing is left running
        assert _within(30, _run, limited.uri, f"SELECT count(*) FROM quail_queries WHERE query = '{HEAVY}'") == [(0,)]


def test_a_malformed_handshake_is_invalid_and_does_not_hold_the_shutdown(tmp_path):
    with ServerProcess(tmp_path) as server:
        channel = grpc.insecure_channel(server.uri.removeprefix("grpc://"))
        handshake = channel.stream_stream("/arrow.flight.protocol.FlightService/Handshake")
        blocked = threading.Event()

        def garbage():
            yield b"\xff\xff\xff not a protobuf"
            yield b"\x0a\xff\xff"
            blocked.wait(60)  # the client keeps its stream open

        with pytest.raises(grpc.RpcError) as err:
            list(handshake(garbage(), timeout=30))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid HandshakeRequest" in err.value.details()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0
        blocked.set()
        channel.close()


def test_planning_counts_toward_the_time_limit(tmp_path):
    """A CASE of 8,000 WHENs (48,000 tokens, under the planner's bound) takes over a second to plan: a time
    limit of half a second stops the statement at its prepare, not after planning and running it."""
    whens = " ".join(f"WHEN id = {i} THEN {i}" for i in range(8_000))
    started = time.monotonic()
    with ServerProcess(tmp_path, "--query-timeout", "0.5") as server:
        with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.adbc_ingest("docs", DOCS, mode="create")
        error = _within(120, _run, server.uri, f"SELECT CASE {whens} END AS c FROM docs")
    assert isinstance(error, adbc_driver_manager.Error) and "time limit" in str(error), error
    assert time.monotonic() - started < 60, "no hang: a bound, not a timing (the parse itself may take seconds)"


def test_a_query_past_the_token_limit_is_refused(tmp_path):
    with ServerProcess(tmp_path, "--max-tokens", "400") as server:
        with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.adbc_ingest("docs", DOCS, mode="create")
        assert _run(server.uri, QUESTION.replace("ORDER BY", "AND id = 1 ORDER BY")) in ([], [(1,)])
        error = _within(30, _run, server.uri, QUESTION.replace("ORDER BY", "AND id = 2 ORDER BY"))
        assert isinstance(error, adbc_driver_manager.Error) and "--max-tokens" in str(error), error
        assert error.vendor_code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]


def test_a_query_generating_past_its_limit_is_stopped(limited):
    """--max-generated-tokens: RESOURCE_EXHAUSTED at the pass after the limit is passed; the server answers on."""
    counting = ("SELECT AI_COMPLETE(PROMPT('Count from one to one hundred in words, starting after {0}.', "
                "CAST(x AS VARCHAR)), {'max_tokens': 30}) FROM numbers WHERE x < 4")
    with pytest.raises(adbc_driver_manager.Error, match="generates more than 8 tokens") as info:
        _run(limited.uri, counting)
    assert info.value.vendor_code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert _run(limited.uri, "SELECT count(*) FROM docs") == [(3,)]


def test_a_server_without_users_takes_any_bearer_token(limited):
    client = flight.FlightClient(limited.uri)
    options = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer None")])
    command = flight.FlightDescriptor.for_command(sql.pack(sql.new("CommandStatementQuery", query="SELECT 7 AS x")))
    info = client.get_flight_info(command, options)
    assert client.do_get(info.endpoints[0].ticket, options).read_all().to_pylist() == [{"x": 7}]


def test_a_long_statement_and_a_large_message_are_refused_and_an_ingest_in_batches_is_not(tmp_path):
    """--max-statement-bytes bounds a statement's text, --max-message-bytes each message a client sends (gRPC
    refuses a longer one before the handler sees it): both RESOURCE_EXHAUSTED; an ingest of any size goes
    through in batches under the bound; the server serves on."""
    rows = pa.table({"x": pa.array(range(40_000), pa.int64())})  # 320 KB in one batch
    with ServerProcess(tmp_path, "--max-statement-bytes", "2000", "--max-message-bytes", "100000") as server, \
            flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
        padded = "SELECT 1 AS x" + " " * 2000
        with pytest.raises(adbc_driver_manager.Error, match=r"the statement is 2,013 bytes: this server takes at "
                                                            r"most 2,000 .*\(ResourceExhausted"):
            cur.execute(padded)
        with pytest.raises(adbc_driver_manager.Error, match="ResourceExhausted"):
            cur.adbc_ingest("big", rows, mode="create")
        cur.adbc_ingest("big", pa.Table.from_batches(rows.to_batches(max_chunksize=4_000)), mode="create")
        cur.execute("SELECT count(*), sum(x) FROM big")
        assert cur.fetchall() == [(40_000, sum(range(40_000)))]
