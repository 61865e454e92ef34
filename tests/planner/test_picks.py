"""A statement that only picks columns, taken in Arrow, gives what DuckDB gives; any other runs in DuckDB."""

import datetime as dt
import decimal
import doctest

import pyarrow as pa
import pytest
from sqlglot import parse_one

from quail.engine.exec.relational import DuckDB
from quail.planner import picks
from quail.planner.picks import column_picks

ROWS = pa.table({
    "id": pa.array([1, 2, None], pa.int64()), "Body": ["a", None, "c"], "ok": [True, False, None],
    "small": pa.array([1, 2, 3], pa.int8()), "score": pa.array([0.5, None, 1.0], pa.float32()),
    "day": [dt.date(2020, 1, 1)] * 3, "at": pa.array([dt.datetime(2020, 1, 1)] * 3, pa.timestamp("us")),
    "price": pa.array([decimal.Decimal("1.50")] * 3, pa.decimal128(10, 2)), "blob": [b"x", b"y", None],
})
OTHER_TYPES = pa.table({"long": pa.array(["a"], pa.large_string()), "view": pa.array(["a"], pa.string_view()),
                        "tags": pa.array(["a"]).dictionary_encode(), "items": [[1]],
                        "at": pa.array([dt.datetime(2020, 1, 1)], pa.timestamp("us", "UTC"))})

TAKEN = [
    'SELECT id FROM "rows"',
    'SELECT ID, body FROM "rows"',
    'SELECT r.id AS "Key", r."BODY" AS text, ok FROM "rows" AS r',
    'SELECT small, score, "day", "at", price, blob, id, id AS again FROM "rows" AS rows',
]
NOT_PICKS = [
    'SELECT id FROM "rows" WHERE id > 1',
    'SELECT DISTINCT id FROM "rows"',
    'SELECT id FROM "rows" ORDER BY id',
    'SELECT id FROM "rows" LIMIT 1',
    'SELECT * FROM "rows"',
    'SELECT id + 1 AS id FROM "rows"',
    'SELECT rows.id FROM "rows" AS r',
    'SELECT a.id FROM "rows" AS a JOIN "rows" AS b ON a.id = b.id',
    'SELECT count(*) AS n FROM "rows"',
]


def test_doctests():
    failed, tried = doctest.testmod(picks)
    assert tried and not failed


@pytest.mark.parametrize("sql", TAKEN)
def test_picked_columns_are_what_duckdb_returns(sql):
    relations = {"rows": ROWS}
    found = column_picks(parse_one(sql, read="duckdb"))
    assert found is not None
    picked = found.take(relations)
    with DuckDB() as db:
        expected = db.run(sql, relations)
    assert picked is not None
    assert picked.schema.equals(expected.schema, check_metadata=True)
    assert picked.equals(expected)


@pytest.mark.parametrize("sql", NOT_PICKS)
def test_other_statements_are_not_picks(sql):
    assert column_picks(parse_one(sql, read="duckdb")) is None


@pytest.mark.parametrize("column", OTHER_TYPES.schema.names)
def test_a_type_duckdb_changes_is_left_to_duckdb(column):
    found = column_picks(parse_one(f'SELECT "{column}" FROM t', read="duckdb"))
    assert found.take({"t": OTHER_TYPES}) is None


def test_a_name_of_no_one_column_is_left_to_duckdb():
    twice = pa.table({"a": [1], "A": [2]})
    assert column_picks(parse_one("SELECT a FROM t", read="duckdb")).take({"t": twice}) is None
    assert column_picks(parse_one("SELECT b FROM t", read="duckdb")).take({"t": twice}) is None
    assert column_picks(parse_one("SELECT a FROM u", read="duckdb")).take({"t": twice}) is None


def test_a_non_nullable_field_comes_back_nullable_as_from_duckdb():
    strict = pa.table({"id": [1, 2]}, schema=pa.schema([pa.field("id", pa.int64(), nullable=False,
                                                                  metadata={b"k": b"v"})]))
    picked = column_picks(parse_one("SELECT id FROM t", read="duckdb")).take({"t": strict})
    with DuckDB() as db:
        expected = db.run("SELECT id FROM t", {"t": strict})
    assert picked.schema.equals(expected.schema, check_metadata=True)
