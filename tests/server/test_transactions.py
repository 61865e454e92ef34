"""Transactions over Flight SQL through the real ADBC driver, and in SQL within a session: what commits is
seen, what rolls back or is left open by a client that died leaves nothing, conflicts are clear errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import quail
from quail.clients.server_process import ServerProcess
from quail.server import sql_messages as sql

IDLE_S = 2.0  # the server's --transaction-idle: a transaction unused this long is rolled back


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    with ServerProcess(tmp_path_factory.mktemp("data"), "--transaction-idle", str(IDLE_S), "--log-level",
                       "warning") as proc:
        with flight_sql.connect(proc.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)")
            cur.execute("INSERT INTO accounts VALUES (1, 100), (2, 50)")
        yield proc.uri


def _rows(uri: str, sql: str) -> list[tuple]:
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


def test_a_rolled_back_transaction_leaves_nothing_and_a_committed_one_is_seen_by_others(uri):
    with flight_sql.connect(uri) as conn:  # DB-API: autocommit off, so the driver begins a transaction
        with conn.cursor() as cur:
            cur.execute("INSERT INTO accounts VALUES (3, 7)")
            cur.execute("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
            cur.execute("SELECT balance FROM accounts WHERE id IN (1, 3) ORDER BY id")
            assert cur.fetchall() == [(90,), (7,)], "the transaction sees its own writes"
            assert _rows(uri, "SELECT balance FROM accounts WHERE id IN (1, 3) ORDER BY id") == [(100,)], \
                "others do not, before it commits"
            cur.executemany("INSERT INTO accounts VALUES (?, ?)", [(4, 1), (5, 2)])
            cur.execute("CREATE TABLE staged AS SELECT id FROM accounts")
        conn.rollback()
        assert _rows(uri, "SELECT count(*), sum(balance) FROM accounts") == [(2, 150)]
        assert _rows(uri, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'staged'") == [(0,)]
        with conn.cursor() as cur:
            cur.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 2")
        conn.commit()
    assert _rows(uri, "SELECT balance FROM accounts WHERE id = 2") == [(51,)]


def _action(client: flight.FlightClient, name: str, message) -> bytes:
    """A Flight SQL action's first result body (its request packed as the spec packs it)."""
    results = list(client.do_action(flight.Action(name, sql.pack(message))))
    return results[0].body.to_pybytes() if results else b""


def test_an_ingest_inside_a_flight_sql_transaction_is_rolled_back_with_it(uri):
    """(ADBC's driver sends no transaction id with an ingest; Flight SQL carries one, as here.)"""
    client = flight.FlightClient(uri)
    begun = sql.unpack(_action(client, "BeginTransaction", sql.new("ActionBeginTransactionRequest")))[1]
    for commit in (False, True):
        if commit:
            begun = sql.unpack(_action(client, "BeginTransaction", sql.new("ActionBeginTransactionRequest")))[1]
        ingest = sql.new("CommandStatementIngest", table="staged_rows", transaction_id=begun.transaction_id,
                         table_definition_options=sql.new("TableDefinitionOptions", if_not_exist=1, if_exists=2))
        rows = pa.table({"id": [1, 2, 3]})
        writer, reader = client.do_put(flight.FlightDescriptor.for_command(sql.pack(ingest)), rows.schema)
        writer.write_table(rows)
        writer.done_writing()
        reader.read()
        writer.close()
        assert _rows(uri, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'staged_rows'") == [(0,)]
        action = sql.END_TRANSACTION_COMMIT if commit else sql.END_TRANSACTION_ROLLBACK
        _action(client, "EndTransaction", sql.new("ActionEndTransactionRequest",
                                                  transaction_id=begun.transaction_id, action=action))
    assert _rows(uri, "SELECT count(*) FROM staged_rows") == [(3,)]
    with pytest.raises(pa.ArrowKeyError, match="unknown transaction"):  # NOT_FOUND
        _action(client, "EndTransaction", sql.new("ActionEndTransactionRequest",
                                                  transaction_id=begun.transaction_id, action=1))


def test_two_transactions_changing_one_row_conflict_clearly_and_the_first_commit_stands(uri):
    with flight_sql.connect(uri) as first, flight_sql.connect(uri) as second:
        with first.cursor() as a, second.cursor() as b:
            a.execute("UPDATE accounts SET balance = 1000 WHERE id = 1")
            with pytest.raises(adbc_driver_manager.Error, match="Conflict.*try again") as conflict:
                b.execute("UPDATE accounts SET balance = 2000 WHERE id = 1")
            assert conflict.value.vendor_code == 10, "gRPC ABORTED"
        first.commit()
        second.rollback()
    assert _rows(uri, "SELECT balance FROM accounts WHERE id = 1") == [(1000,)]
    _rows(uri, "UPDATE accounts SET balance = 100 WHERE id = 1")


def test_a_transaction_left_open_by_a_client_that_died_is_rolled_back_once_idle(uri):
    client = textwrap.dedent(f"""
        import os, adbc_driver_flightsql.dbapi as flight_sql
        conn = flight_sql.connect({uri!r})
        with conn.cursor() as cur:
            cur.execute("UPDATE accounts SET balance = 999 WHERE id = 2")
        print("updated", flush=True)
        os._exit(0)
    """)
    assert subprocess.run([sys.executable, "-c", client], capture_output=True, text=True,
                          timeout=60).stdout.strip() == "updated"
    with pytest.raises(adbc_driver_manager.Error, match="Conflict"):
        _rows(uri, "UPDATE accounts SET balance = 52 WHERE id = 2")  # the dead client's change holds the row
    assert _rows(uri, "SELECT balance FROM accounts WHERE id = 2") == [(51,)]
    time.sleep(IDLE_S + 1.0)
    _rows(uri, "UPDATE accounts SET balance = 52 WHERE id = 2")  # rolled back once idle: the row is free
    assert _rows(uri, "SELECT balance FROM accounts WHERE id = 2") == [(52,)]


def test_sql_transactions_in_a_session_and_in_one_text(uri):
    with quail.connect(uri, dialect="duckdb") as session, session.cursor() as cur:  # a session: its cookie
        cur.execute("BEGIN")
        cur.execute("CREATE TEMP TABLE scratch AS SELECT 5 AS n")
        cur.execute("INSERT INTO accounts SELECT 20 + n, n FROM scratch")
        assert _rows(uri, "SELECT count(*) FROM accounts WHERE id = 25") == [(0,)]
        cur.execute("ROLLBACK")
        cur.execute("BEGIN")
        cur.execute("INSERT INTO accounts VALUES (26, 6)")
        cur.execute("COMMIT")
        with pytest.raises(adbc_driver_manager.Error, match="no transaction is open"):
            cur.execute("COMMIT")
    assert _rows(uri, "SELECT id FROM accounts WHERE id > 20") == [(26,)]
    _rows(uri, "BEGIN; INSERT INTO accounts VALUES (27, 7); UPDATE accounts SET balance = 8 WHERE id = 27; COMMIT")
    assert _rows(uri, "SELECT balance FROM accounts WHERE id = 27") == [(8,)]
    with pytest.raises(adbc_driver_manager.Error, match="left their transaction open, so it was rolled back"):
        _rows(uri, "BEGIN; INSERT INTO accounts VALUES (28, 8)")
    with pytest.raises(adbc_driver_manager.Error, match="outside a session"):
        _rows(uri, "BEGIN")
    assert _rows(uri, "SELECT count(*) FROM accounts WHERE id = 28") == [(0,)]
    _rows(uri, "DELETE FROM accounts WHERE id > 20")


def test_a_session_whose_client_left_with_its_transaction_open_leaves_nothing(uri):
    session = quail.connect(uri, dialect="duckdb")
    with session.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("INSERT INTO accounts VALUES (30, 3)")
        cur.execute("UPDATE accounts SET balance = 0 WHERE id = 1")
    session.close()
    assert _rows(uri, "SELECT count(*) FROM accounts WHERE id = 30") == [(0,)]
    time.sleep(IDLE_S + 1.0)
    _rows(uri, "UPDATE accounts SET balance = 101 WHERE id = 1")  # the session's connection was closed
    assert _rows(uri, "SELECT balance FROM accounts WHERE id IN (1, 30)") == [(101,)]
