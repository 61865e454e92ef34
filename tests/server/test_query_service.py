"""Statements take turns to plan (server/query_service.py), none past its patience; a started query's result schema
waits for its first pass out of the turn; a stopping server warms nothing."""

from __future__ import annotations

import threading

import pyarrow as pa

from quail.engine.exec.catalog import MemoryCatalog
from quail.engine.exec.database import Database
from quail.engine.runtime.text_segments import SegmentCache
from quail.server import query_service, warming
from quail.server.flight_sql import FlightSQLHandler
from quail.server.query_service import QueryService


def _two_statements(runtime, monkeypatch, patience: float):
    """The first statement held inside its planning until released, then a second sent: (the first's
    thread, the second's, the release, each statement going in and out of the planner in order)."""
    inside, release, order = threading.Event(), threading.Event(), []
    planned = query_service.plan_statement

    def recorded(text, *args):
        order.append(("in", text.split()[-3]))
        if "first" in text:
            inside.set()
            release.wait(30)
        out = planned(text, *args)
        order.append(("out", text.split()[-3]))
        return out

    monkeypatch.setattr(query_service, "plan_statement", recorded)
    monkeypatch.setattr(query_service, "PLAN_PATIENCE_S", patience)
    service = QueryService(runtime)
    first = _plan(service, "first")
    assert inside.wait(30)
    return first, _plan(service, "second"), release, order


def _plan(service: QueryService, name: str) -> threading.Thread:
    catalog = MemoryCatalog()
    catalog.register("t", pa.table({"a": [1, 2]}))
    thread = threading.Thread(target=service.plan, args=(f"SELECT a AS {name} FROM t", catalog, "duckdb"))
    thread.start()
    return thread


def test_a_statement_plans_after_the_one_planning(runtime, monkeypatch):
    first, second, release, order = _two_statements(runtime, monkeypatch, patience=60)
    second.join(0.5)
    assert second.is_alive() and order == [("in", "first")], "the second waits for its turn"
    release.set()
    first.join(30)
    second.join(30)
    assert order == [("in", "first"), ("out", "first"), ("in", "second"), ("out", "second")]


def test_a_statement_waits_for_a_slow_plan_no_longer_than_its_patience(runtime, monkeypatch):
    first, second, release, order = _two_statements(runtime, monkeypatch, patience=0.05)
    second.join(30)
    assert not second.is_alive() and first.is_alive(), "planned beside the slow one"
    assert order == [("in", "first"), ("in", "second"), ("out", "second")]
    release.set()
    first.join(30)
    assert order[-1] == ("out", "first")


def test_a_started_query_s_schema_waits_for_it_to_be_under_way_out_of_the_planning_turn(runtime, monkeypatch):
    """The event `started` gives back (the head start's QueryWork.under_way) holds the result schema, at most
    SCHEMA_WAIT_S, but not the planning turn: another statement plans meanwhile."""
    monkeypatch.setattr(query_service, "SCHEMA_WAIT_S", 60)
    service, under_way, got = QueryService(runtime), threading.Event(), {}
    catalog = MemoryCatalog()
    catalog.register("t", pa.table({"a": [1, 2]}))
    first = threading.Thread(target=lambda: got.update(first=service.plan(
        "SELECT a AS first FROM t", catalog, "duckdb", started=lambda plan: under_way)))
    first.start()
    second = _plan(service, "second")
    second.join(30)
    assert not second.is_alive() and first.is_alive(), "the second planned while the first's schema waits"
    under_way.set()
    first.join(30)
    assert got["first"][1].names == ["first"]
    monkeypatch.setattr(query_service, "SCHEMA_WAIT_S", 0.01)
    plan, schema = service.plan("SELECT a AS never FROM t", catalog, "duckdb", started=lambda plan: threading.Event())
    assert schema.names == ["never"], "an event never set holds the schema SCHEMA_WAIT_S only"


def test_warming_cancelled_as_the_server_stops_leaves_no_texts_counted_as_warming(runtime, tmp_path, monkeypatch):
    """quail_texts_warming counts the texts the warming thread has not reached: those of tasks cancel_all
    cancels before they run leave it too, so the gauge is back to 0."""
    monkeypatch.setattr(runtime, "texts", SegmentCache())
    inside, release = threading.Event(), threading.Event()

    def blocked(texts):
        inside.set()
        release.wait(30)

    monkeypatch.setattr(runtime, "warm", blocked)
    monkeypatch.setattr(warming, "WARM_ROWS", 2)
    store = Database(tmp_path)
    try:
        handler = FlightSQLHandler(store, QueryService(runtime), "duckdb")
        handler.warming.warm(pa.table({"body": [f"Review {i}." for i in range(6)]}))  # three tasks of two texts
        assert inside.wait(30) and handler.metrics.warming._value.get() == 6
        handler.cancel_all()
        assert handler.metrics.warming._value.get() == 2, "the two tasks not begun are no longer counted"
        release.set()
        handler.warming.pool.shutdown(wait=True)
        assert handler.metrics.warming._value.get() == 0
    finally:
        store.close()


def test_a_write_as_the_server_stops_warms_nothing_and_does_not_fail(runtime, tmp_path, monkeypatch):
    """FlightSQLHandler.warm after cancel_all (a stopping server): the write's rows are not tokenized, and
    the write itself is not made to fail."""
    monkeypatch.setattr(runtime, "texts", SegmentCache())
    store = Database(tmp_path)
    try:
        handler = FlightSQLHandler(store, QueryService(runtime), "duckdb")
        handler.cancel_all()
        handler.warming.warm(pa.table({"body": ["Review 1: late and cold."]}))
        assert runtime.texts.tokens == 0
    finally:
        store.close()
