"""A call's writes commit only while the call is there to be told (Lease.committed_if), on a real database.

The server-level case (a SIGTERM past the drain's grace cutting off an ingest): test_server_own.py."""

from __future__ import annotations

import pytest

from quail.engine.errors import Cancelled, NotFound
from quail.engine.exec.database import Database
from quail.engine.exec.relational import duckdb_errors
from quail.server.connections import Connections


def _tables(database: Database) -> list[str]:
    con = database.cursor()
    try:
        listed = con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()
        return [name for (name,) in listed if not name.startswith("__quail")]  # the server's own
    finally:
        con.close()


def test_a_write_commits_while_its_call_lives_and_rolls_back_after_it_ended(tmp_path):
    database = Database(tmp_path)
    connections = Connections(database)
    with connections.lease(None, None, "-") as lease:
        with lease.committed_if(lambda: True):
            lease.con.execute("CREATE TABLE told AS SELECT 1 AS x")
    with connections.lease(None, None, "-") as lease:
        with pytest.raises(Cancelled, match="nothing was written"):
            with lease.committed_if(lambda: False):
                lease.con.execute("CREATE TABLE untold AS SELECT 1 AS x")
        lease.con.execute("SELECT 1")  # the connection is usable after the rollback
    with connections.lease(None, None, "-") as lease:
        with pytest.raises(NotFound):
            with lease.committed_if(lambda: True):
                lease.con.execute("CREATE TABLE failed AS SELECT 1 AS x")
                with duckdb_errors():
                    lease.con.execute("SELECT * FROM no_such_table")
    assert _tables(database) == ["told"]
    database.close()


def test_inside_an_open_transaction_the_write_waits_for_its_commit(tmp_path):
    database = Database(tmp_path)
    connections = Connections(database)
    transaction = connections.begin("-")
    with connections.lease(transaction, None, "-") as lease:
        with lease.committed_if(lambda: False):  # its call's answer is not the commit: EndTransaction's is
            lease.con.execute("CREATE TABLE later AS SELECT 1 AS x")
    assert _tables(database) == []
    connections.end(transaction, "-", commit=True)
    assert _tables(database) == ["later"]
    database.close()
