"""Every call the README and docs show exists: each `quail.<name>` they name resolves, the session calls they
list are on both sessions, and `quail.Session(config, endpoint=uri)` is the remote session they promise."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pyarrow as pa
import pytest

import quail
from quail.engine.errors import InvalidArgument
from quail.remote import RemoteQuery, RemoteSession
from quail.session import Query, Session

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_PYTHON = {"quail.duckdb", "quail.duckdb.tmp", "quail.duckdb.wal", "quail.last_query"}  # files, an option
SESSION_CALLS = ("register", "sql", "close", "__enter__", "__exit__")
QUERY_CALLS = ("run", "explain", "collect", "execute_stream")


def _resolves(dotted: str) -> bool:
    """Whether a dotted name is a module, or an attribute reached from the longest module prefix of it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                found = getattr(found, name)
        except AttributeError:
            return False
        return True
    return False


def test_every_quail_name_the_pages_show_resolves():
    named = {name for page in PAGES for name in re.findall(r"`(quail(?:\.\w+)+)", page.read_text())}
    assert {"quail.Session", "quail.connect", "quail.RemoteSession"} <= named
    missing = sorted(name for name in named - NOT_PYTHON if not _resolves(name))
    assert not missing, f"named in the docs, not in the package: {missing}"


@pytest.mark.parametrize("owner, calls", [(Session, SESSION_CALLS), (RemoteSession, SESSION_CALLS),
                                          (Query, QUERY_CALLS), (RemoteQuery, QUERY_CALLS)])
def test_both_sessions_make_the_documented_calls(owner, calls):
    assert [call for call in calls if not callable(getattr(owner, call, None))] == []


def test_a_session_with_an_endpoint_is_the_remote_session(server):
    table = pa.table({"id": [1, 2], "body": ["Good soup.", "Cold tea."]})
    with quail.Session(quail.EngineConfig(), endpoint=server.uri) as session:
        assert isinstance(session, RemoteSession)
        session.register("notes", quail.DocumentProvider.from_table(table, id_col="id"))
        result = session.sql("SELECT id FROM notes ORDER BY id").run()
        assert result.to_rows() == [{"id": 1}, {"id": 2}] and isinstance(result.report, quail.Report)
    with pytest.raises(InvalidArgument, match="the server's"):
        quail.Session(quail.EngineConfig(precision="bf16"), endpoint=server.uri)
