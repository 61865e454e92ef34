"""The data directory: create/append/replace, restart, and leftovers of interrupted writes."""

from __future__ import annotations

import pyarrow as pa
import pytest

from quail.engine.errors import AlreadyExists, InvalidArgument, NotFound
from quail.engine.storage import MANIFEST, TableStore


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

    reopened = TableStore(tmp_path)
    assert reopened.names() == ["Docs", "other"]
    assert reopened.table("docs").equals(store.table("docs"))
    assert reopened.table("other")["id"].to_pylist() == [10, 11]
    files = {p.name for p in tmp_path.iterdir()}
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
    (tmp_path / "deadbeef.arrow").write_bytes(b"half a part")
    (tmp_path / f".{MANIFEST}.123.tmp").write_text("{")
    reopened = TableStore(tmp_path)
    assert reopened.table("t").num_rows == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([MANIFEST, *reopened._tables["t"].parts])


def test_bad_names_and_unknown_tables(tmp_path):
    store = TableStore(tmp_path)
    for bad in ["", "../x", ".hidden"]:
        with pytest.raises(InvalidArgument):
            store.write(bad, _rows(1))
    with pytest.raises(NotFound):
        store.table("missing")
