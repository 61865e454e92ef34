"""Server-side statement state is bounded: abandoned tickets, results and prepared statements cannot
pile up (the least recently used go, and a later use of their handle is NOT_FOUND)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest

from quail.engine.errors import NotFound
from quail.engine.exec.plan import AIStep, PhysicalPlan, SQLStep
from quail.server import statements as statements_module
from quail.server.admission import Admission
from quail.server.read_ahead import ReadAhead
from quail.server.statements import PLAN_HOLDS_S, HeadStart, Kept, Statements


def test_prepared_statements_are_bounded_by_count_and_bytes_least_recently_used_first():
    statements = Statements(max_count=3, max_bytes=1 << 30)
    first, second, third = (statements.prepare(f"SELECT {i}", "-") for i in range(3))
    statements.prepared(first, "-")  # used: now the most recent
    statements.prepare("SELECT 3", "-")
    with pytest.raises(NotFound, match="least recently used"):
        statements.prepared(second, "-")
    assert [statements.prepared(h, "-").query for h in (first, third)] == ["SELECT 0", "SELECT 2"]

    by_bytes = Statements(max_count=1000, max_bytes=10 << 20)
    handles = [by_bytes.prepare("SELECT '" + "x" * (1 << 20) + "'", "-") for _ in range(20)]
    kept = [h for h in handles if _exists(by_bytes, h)]
    assert 1 <= len(kept) <= 3 and kept == handles[-len(kept):], "a megabyte statement is ~4 MB planned"


def test_bound_parameters_count_toward_the_bound():
    statements = Statements(max_count=1000, max_bytes=8 << 20)
    old, new = statements.prepare("SELECT ?", "-"), statements.prepare("SELECT ?", "-")
    statements.bind(new, pa.table({"p": pa.array([b"x" * (8 << 20)])}), "-")
    assert not _exists(statements, old) and _exists(statements, new)


def test_a_prepared_plan_holds_for_its_catalog_version_and_dialect_an_ai_one_a_short_while(monkeypatch):
    """(The ADBC test beside it: a table replaced between prepare and run.)"""
    ask = AIStep("r", "a", "filter", "Is {0} kind?", ("body",))
    planned = Kept(PhysicalPlan((ask,), (), "a"), pa.schema([]), 3, "snowflake")
    plain = Kept(PhysicalPlan((SQLStep("SELECT 1", "r"),), (), "r"), pa.schema([]), 3, "snowflake")
    assert planned.holds(3, "snowflake") and plain.holds(3, "snowflake")
    assert not planned.holds(4, "snowflake") and not planned.holds(3, "duckdb") and not plain.holds(4, "snowflake")
    monkeypatch.setattr(statements_module.time, "monotonic", lambda: planned.at + PLAN_HOLDS_S)
    assert not planned.holds(3, "snowflake"), "the KV pool its costs read has changed since"
    assert plain.holds(3, "snowflake"), "a plan that asks the model nothing reads no KV pool"


def test_a_head_start_is_stopped_unless_its_ticket_is_redeemed_in_time_over_its_catalog_version(monkeypatch):
    """(The ADBC tests beside it: a statement prepared and closed unrun; a table replaced between prepare
    and run.) A stopped head start's work is cancelled and its stream closed."""
    statements, plan = Statements(), PhysicalPlan((), (), "r")

    pool = ThreadPoolExecutor(4)

    def head_start() -> HeadStart:
        handle, work = statements.begin("SELECT 1", "-")
        return HeadStart(handle, work, ReadAhead((batch for batch in [pa.record_batch({"a": [1]})]), pool), 1)

    def stopped(head: HeadStart) -> bool:
        return head.work.cancelled.is_set() and next(iter(head.batches), None) is None

    late, stale, taken, closed = (head_start() for _ in range(4))
    prepared = {head.handle: statements.prepare("SELECT 1", "-", head=head) for head in (late, stale, taken, closed)}
    statements.close(prepared[closed.handle], "-")
    assert stopped(closed)
    for head in (stale, taken):
        assert statements.take_head(statements.prepared(prepared[head.handle], "-")) == head.handle
        statements.add_pending(plan, pa.schema([]), "SELECT 1", "-", head.handle)
    assert statements.start(stale.handle, "-", 2)[3] is None and stopped(stale), "the tables changed"
    assert statements.start(taken.handle, "-", 1)[2:4] == (taken.work, taken) and not stopped(taken)
    monkeypatch.setattr(statements_module.time, "monotonic", lambda: late.at + PLAN_HOLDS_S)
    assert not stopped(late)
    statements.prepare("SELECT 2", "-")
    assert stopped(late), "not taken up in time: stopped at the next prepare"


def test_a_head_start_leaves_at_least_half_the_admission_limit_free():
    assert not Admission(1).spare(), "never under a limit of one"
    four = Admission(4)
    with four.admit():
        assert four.spare()
        with four.admit():
            assert not four.spare()


def test_unredeemed_tickets_and_results_are_bounded():
    statements = Statements(max_count=2, max_bytes=1 << 30)
    plan = PhysicalPlan((), (), "r")
    tickets = [statements.add_pending(plan, pa.schema([]), f"SELECT {i}", "-") for i in range(3)]
    with pytest.raises(NotFound):
        statements.start(tickets[0], "-", 0)
    assert statements.start(tickets[2], "-", 0)[0] is plan
    results = [statements.add_result(pa.table({"rows_affected": [i]}), "-") for i in range(3)]
    assert statements.take_result(results[0], "-") is None
    assert statements.take_result(results[2], "-").to_pylist() == [{"rows_affected": 2}]
    assert statements.take_result(results[2], "-") is None, "a result is read once"


def _exists(statements: Statements, handle: bytes) -> bool:
    try:
        statements.prepared(handle, "-")
        return True
    except NotFound:
        return False


def test_a_queries_time_limit_counts_from_its_planning():
    """The work record a redeemed ticket runs under has the deadline its planning started (Limits.work(since)):
    seconds spent planning are not given again to running it."""
    from quail.server.admission import Limits

    statements, plan = Statements(Limits(timeout_s=5.0).work), PhysicalPlan((), (), "r")
    handle = statements.add_pending(plan, pa.schema([]), "SELECT 1", "-", since=1000.0)
    work = statements.start(handle, "-", 0)[2]
    assert work.deadline == 1005.0
    fresh = statements.start(statements.add_pending(plan, pa.schema([]), "SELECT 1", "-"), "-", 0)[2]
    assert fresh.deadline > 1005.0


def test_handles_belong_to_the_user_who_made_them():
    """Another user's prepared statement, ticket or result is unknown to a caller, and cancelling another
    user's query does nothing (an admin's cancel, user None, reaches any)."""
    from quail.server.flight_messages import CANCEL_STATUS_CANCELLED, CANCEL_STATUS_NOT_CANCELLABLE

    statements, plan = Statements(), PhysicalPlan((), (), "r")
    prepared = statements.prepare("SELECT 1", "ann")
    for use in (lambda user: statements.prepared(prepared, user), lambda user: statements.close(prepared, user),
                lambda user: statements.bind(prepared, None, user)):
        with pytest.raises(NotFound):
            use("bob")
    assert statements.prepared(prepared, "ann").query == "SELECT 1"
    ticket = statements.add_pending(plan, pa.schema([]), "SELECT 1", "ann")
    with pytest.raises(NotFound):
        statements.start(ticket, "bob", 0)
    assert statements.cancel(ticket, "bob") == CANCEL_STATUS_NOT_CANCELLABLE
    assert statements.start(ticket, "ann", 0)[0] is plan, "untouched by the other user's tries"
    result = statements.add_result(pa.table({"rows_affected": [1]}), "ann")
    assert statements.take_result(result, "bob") is None
    assert statements.take_result(result, "ann").num_rows == 1
    other = statements.add_pending(plan, pa.schema([]), "SELECT 2", "ann")
    assert statements.cancel(other, None) == CANCEL_STATUS_CANCELLED
