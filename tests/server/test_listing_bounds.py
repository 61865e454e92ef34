"""Catalog listings stay under a client's message limit (16 MiB by default in ADBC's driver): a table of
tens of thousands of columns is listed with its names and types alone, and a listing of many tables goes in
batches of at most MAX_BATCH_BYTES (each one Flight message). The listings themselves are tested through
ADBC in test_write_paths.py; a table wide enough to pass the limit takes a DuckDB minute to create."""

from __future__ import annotations

import pyarrow as pa

from quail.server.ipc import bounded_batches, schema_bytes
from quail.server.metadata import MAX_LISTED_SCHEMA_BYTES, _bounded


def test_a_schema_past_the_bound_is_listed_without_column_metadata():
    meta = {"ARROW:FLIGHT:SQL:TYPE_NAME": "INTEGER", "ARROW:FLIGHT:SQL:TABLE_NAME": "wide" * 50}
    columns = MAX_LISTED_SCHEMA_BYTES // 200
    wide = pa.schema([pa.field(f"c{i}", pa.int32(), metadata=meta) for i in range(columns)])
    assert len(schema_bytes(wide)) > MAX_LISTED_SCHEMA_BYTES
    listed = pa.ipc.read_schema(pa.py_buffer(_bounded(wide)))
    assert listed.names == wide.names and listed.types == wide.types and listed.field(0).metadata is None
    narrow = pa.schema([pa.field("a", pa.int32(), metadata=meta)])
    assert pa.ipc.read_schema(pa.py_buffer(_bounded(narrow))).field(0).metadata == narrow.field(0).metadata


def test_a_listing_goes_in_batches_under_the_bound_rows_whole_and_in_order():
    rows = pa.table({"name": [f"t{i}" for i in range(1001)], "schema": [b"x" * 100] * 1000 + [b"y" * 5000]})
    batches = bounded_batches(rows, 10_000)
    assert pa.Table.from_batches(batches).equals(rows)
    assert all(b.nbytes <= 10_000 for b in batches) and len(batches) > 1
    alone = bounded_batches(pa.table({"schema": [b"z" * 50_000]}), 10_000)
    assert [b.num_rows for b in alone] == [1], "a row larger than the bound goes whole"
