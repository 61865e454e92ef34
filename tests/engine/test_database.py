"""The data directory's DuckDB database: the earlier store imported with nothing lost, one server per
directory, and the catalog the planner reads over a connection."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from quail.engine.errors import Cancelled, Unavailable
from quail.engine.exec import legacy_store
from quail.engine.exec.database import Database, DatabaseCatalog, objects
from quail.engine.exec.plan import Write
from quail.engine.exec.writes import run_writes
from quail.engine.runtime.query_work import QueryWork

EARLIER = Path(__file__).parent.parent / "data" / "earlier-store"  # written by the earlier store's own writer


def _earlier(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(EARLIER, data)
    return data


STORED_AS = {pa.large_string(): pa.string(), pa.timestamp("us", "UTC"): pa.timestamp("us", "Etc/UTC"),
             pa.list_(pa.string()): pa.list_(pa.field("l", pa.string()))}  # DuckDB's Arrow names for these


def _as_stored(schema: pa.Schema) -> pa.Schema:
    """The schema DuckDB returns for rows of this Arrow schema once stored."""
    return pa.schema([field.with_type(STORED_AS.get(field.type, field.type)) for field in schema])


def test_every_table_row_and_type_of_the_earlier_store_is_imported(tmp_path):
    data = _earlier(tmp_path)
    expected = legacy_store.read_tables(data / legacy_store.STORE / legacy_store.MANIFEST)
    assert sorted(expected) == ["Docs", "empty", "replaced", "typed"] and expected["Docs"].num_rows == 4
    database = Database(data)
    with database.cursor() as con:
        assert sorted(name for _, name, _ in objects(con)) == sorted(expected)
        for name, table in expected.items():
            stored = con.sql(f'SELECT * FROM "{name}"').to_arrow_table()
            assert stored.schema == _as_stored(table.schema), name
            assert repr(stored.cast(table.schema).to_pylist()) == repr(table.to_pylist()), name  # NaN as NaN
        assert con.sql('SELECT body FROM "Docs" WHERE stars = 3.25::FLOAT').fetchall() == [("Fine",)]
    database.close()
    assert not (data / legacy_store.STORE).exists(), "set aside once the import committed"
    assert (data / legacy_store.IMPORTED / legacy_store.MANIFEST).exists(), "its files kept until the user deletes them"
    again = Database(data)
    with again.cursor() as con:
        assert con.sql('SELECT count(*) FROM "Docs"').fetchall() == [(4,)], "not imported twice"
    again.close()


def test_an_import_interrupted_after_its_commit_is_finished_without_doubling_rows(tmp_path):
    """A crash between the import's commit and the renaming of the old folder: the next open finds the tables
    there, skips them, and sets the folder aside."""
    data = _earlier(tmp_path)
    database = Database(data)
    database.close()
    shutil.copytree(EARLIER / legacy_store.STORE, data / legacy_store.STORE)  # as if never renamed
    shutil.rmtree(data / legacy_store.IMPORTED)
    reopened = Database(data)
    with reopened.cursor() as con:
        assert con.sql('SELECT count(*) FROM "Docs"').fetchall() == [(4,)]
    reopened.close()
    assert (data / legacy_store.IMPORTED).exists() and not (data / legacy_store.STORE).exists()


def test_the_older_layout_in_the_data_directory_itself_is_imported(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for path in (EARLIER / legacy_store.STORE).iterdir():
        shutil.copy(path, data / path.name)
    database = Database(data)
    with database.cursor() as con:
        assert con.sql("SELECT count(*) FROM typed").fetchall() == [(2,)]
    database.close()
    assert not (data / legacy_store.MANIFEST).exists()
    assert (data / legacy_store.IMPORTED / legacy_store.MANIFEST).exists()


def test_a_broken_part_file_imports_nothing_and_leaves_the_store_in_place(tmp_path):
    data = _earlier(tmp_path)
    manifest = json.loads((data / legacy_store.STORE / legacy_store.MANIFEST).read_text())
    part = data / legacy_store.STORE / manifest["tables"]["typed"]["parts"][0]
    good = part.read_bytes()
    part.write_bytes(b"not arrow")
    with pytest.raises(Unavailable, match="nothing was imported"):
        Database(data)
    assert (data / legacy_store.STORE / legacy_store.MANIFEST).exists()
    part.write_bytes(good)
    database = Database(data)
    with database.cursor() as con:
        assert len(objects(con)) == 4
    database.close()


def test_a_second_process_over_the_same_directory_is_refused_while_the_first_is_open(tmp_path):
    opening = [sys.executable, "-c", f"from quail.engine.exec.database import Database; Database({str(tmp_path)!r})"]
    first = Database(tmp_path)
    refused = subprocess.run(opening, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "is in use by another Quail server" in refused.stderr
    first.close()
    assert subprocess.run(opening, capture_output=True, text=True, timeout=120).returncode == 0


def test_the_catalog_lists_tables_and_views_of_its_connection_with_their_schemas(tmp_path):
    database = Database(tmp_path)
    with database.cursor() as con:
        con.execute("CREATE TABLE Docs (id INTEGER PRIMARY KEY, body VARCHAR NOT NULL, score FLOAT)")
        con.execute("INSERT INTO Docs VALUES (1, 'a', 0.5), (2, 'bb', NULL)")
        con.execute("CREATE VIEW long_docs AS SELECT * FROM Docs WHERE length(body) > 1")
        con.execute("CREATE SCHEMA other")
        con.execute("CREATE TABLE other.hidden (x INTEGER)")
        catalog = DatabaseCatalog(database, con)
        assert catalog.names() == ["Docs", "long_docs"] and catalog.has("docs") and not catalog.has("hidden")
        assert catalog.schema("docs") == pa.schema([("id", pa.int32()), ("body", pa.string()),
                                                   ("score", pa.float32())])
        assert catalog.rows("long_docs") == 1 and catalog.column("docs", "BODY").to_pylist() == ["a", "bb"]
        assert catalog.column("docs", "missing") is None and catalog.relations(["docs"]) == {}
    database.close()


def test_writes_whose_work_was_cancelled_do_not_commit(tmp_path):
    """A write's work cancelled (its call ended) before its transaction commits: the rows are rolled back and
    the write ends Cancelled, as DuckDB would otherwise run the COMMIT (an interrupt before a statement starts
    is lost)."""
    database = Database(tmp_path)
    con = database.cursor()
    con.execute("CREATE TABLE t (x INT)")
    work = QueryWork()
    work.cancel()
    with pytest.raises(Cancelled):
        run_writes([Write("INSERT INTO t VALUES (1)", "INSERT", False)], DatabaseCatalog(database, con), None, work,
                   atomic=True)
    assert database.cursor().execute("SELECT count(*) FROM t").fetchall() == [(0,)]
    assert con.execute("SELECT count(*) FROM t").fetchall() == [(0,)], "nothing is left open on the connection"
    database.close()
