"""The data directory: create/append/replace, restart, leftovers of interrupted writes, and nothing
touched outside Quail's own subfolder."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from quail.engine.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable
from quail.engine.exec.storage import LOCK, MANIFEST, MARKER, STORE, TableStore


def _rows(n: int, start: int = 0) -> pa.Table:
    return pa.table({"id": list(range(start, start + n)), "text": [f"row {i}" for i in range(start, start + n)]})


def test_create_append_replace_survive_reopen(tmp_path):
    store = TableStore(tmp_path)
    assert store.write("Docs", _rows(3)) == 3
    with pytest.raises(AlreadyExists):
        store.write("docs", _rows(1))
    store.write("docs", _rows(2, start=3), if_exists="append", if_missing="fail")
    assert store.table("DOCS")["id"].to_pylist() == [0, 1, 2, 3, 4]
    store.write("other", _rows(1), if_exists="replace")
    store.write("other", _rows(2, start=10), if_exists="replace")

    store.close()
    reopened = TableStore(tmp_path)
    assert reopened.names() == ["Docs", "other"]
    assert reopened.table("docs").equals(store.table("docs"))
    assert reopened.table("other")["id"].to_pylist() == [10, 11]
    files = {p.name for p in (tmp_path / STORE).iterdir()} - {MARKER, LOCK}
    assert len(files) == 1 + 2 + 1, "manifest, two parts of docs, one of other (replaced part removed)"


def test_append_checks_columns_and_existence(tmp_path):
    store = TableStore(tmp_path)
    with pytest.raises(NotFound):
        store.write("t", _rows(1), if_exists="append", if_missing="fail")
    store.write("t", _rows(1))
    with pytest.raises(InvalidArgument):
        store.write("t", pa.table({"other": [1]}), if_exists="append")
    store.write("t", pa.table({"id": pa.array([7], pa.int32()), "text": ["x"]}), if_exists="append")
    assert store.table("t").schema == _rows(1).schema


def test_leftovers_of_an_interrupted_write_are_ignored_and_removed(tmp_path):
    store = TableStore(tmp_path)
    store.write("t", _rows(2))
    store.close()
    own = tmp_path / STORE
    (own / f"{'deadbeef' * 4}.arrow").write_bytes(b"half a part")
    (own / f".{MANIFEST}.{'0123abcd' * 4}.tmp").write_text("{")
    reopened = TableStore(tmp_path)
    assert reopened.table("t").num_rows == 2
    assert sorted(p.name for p in own.iterdir()) == sorted([MANIFEST, MARKER, LOCK, *reopened._tables["t"].parts])


def test_files_quail_did_not_write_are_never_removed(tmp_path):
    (tmp_path / "thesis.txt").write_text("four years of work")
    (tmp_path / "notes").mkdir()
    (tmp_path / "0123456789abcdef0123456789abcdef.arrow").write_bytes(b"someone's own Arrow file")
    store = TableStore(tmp_path)
    store.write("t", _rows(1))
    (tmp_path / STORE / "mine.txt").write_text("a user's file inside Quail's folder")
    store.close()
    TableStore(tmp_path).close()
    assert (tmp_path / "thesis.txt").read_text() == "four years of work"
    assert (tmp_path / "notes").is_dir()
    assert (tmp_path / "0123456789abcdef0123456789abcdef.arrow").exists()
    assert (tmp_path / STORE / "mine.txt").exists()


def test_a_folder_of_the_store_name_that_is_not_quails_is_refused(tmp_path):
    (tmp_path / STORE).mkdir()
    (tmp_path / STORE / "data.csv").write_text("a,b")
    with pytest.raises(Unavailable, match=MARKER):
        TableStore(tmp_path)
    assert (tmp_path / STORE / "data.csv").exists()


def test_a_second_store_on_the_same_directory_is_refused_until_the_first_closes(tmp_path):
    first = TableStore(tmp_path)
    with pytest.raises(Unavailable, match="in use by another Quail server"):
        TableStore(tmp_path)
    first.close()
    TableStore(tmp_path).close()


def test_a_store_of_the_earlier_layout_moves_into_the_subfolder(tmp_path):
    part = "89abcdef" * 4 + ".arrow"
    with pa.OSFile(str(tmp_path / part), "wb") as f, pa.ipc.new_file(f, _rows(2).schema) as writer:
        writer.write_table(_rows(2))
    (tmp_path / MANIFEST).write_text(json.dumps({"format": 1, "tables": {"Old": {"parts": [part]}}}))
    (tmp_path / "readme.txt").write_text("mine")
    store = TableStore(tmp_path)
    assert store.table("old")["id"].to_pylist() == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([STORE, "readme.txt"])


def test_bad_names_and_unknown_tables(tmp_path):
    store = TableStore(tmp_path)
    for bad in ["", "../x", ".hidden"]:
        with pytest.raises(InvalidArgument):
            store.write(bad, _rows(1))
    with pytest.raises(NotFound):
        store.table("missing")
