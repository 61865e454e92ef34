"""A statement that only picks rows and columns, taken in Arrow, gives what DuckDB gives; any other runs in DuckDB."""

import datetime as dt
import decimal

import pyarrow as pa
import pytest
from sqlglot import parse_one

from quail.engine.exec.relational import DuckDB
from quail.planner.picks import picks_of

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
    'SELECT * FROM "rows"',
    'SELECT r.*, ROW_NUMBER() OVER () AS n, CAST(r.body AS TEXT) AS t, CAST(small AS VARCHAR) AS s, '
    'CAST(ok AS TEXT) AS b FROM "rows" AS r',
    'SELECT "rows".*, ROW_NUMBER() OVER () AS n FROM "rows" WHERE id BETWEEN 2 AND 3',
    'SELECT id FROM "rows" WHERE id > 1',
    'SELECT id FROM "rows" WHERE NOT id > 1',
    'SELECT id FROM "rows" WHERE 2 <= id AND (body = \'c\' OR body IS NULL)',
    'SELECT id FROM "rows" WHERE id IN (1, 3, -4) OR small NOT IN (2)',
    'SELECT id FROM "rows" WHERE id NOT BETWEEN 2 AND 5 OR body IS NOT NULL',
    'SELECT id FROM "rows" WHERE body < \'b\' OR small <> 3000000000',
]
NOT_PICKS = [
    'SELECT id FROM "rows" WHERE id + 1 > 1',
    'SELECT a FROM "rows" AS r(a, b)',
    'SELECT r.* FROM "rows" AS r(a, b)',
    'SELECT id FROM "rows" TABLESAMPLE (1 ROWS)',
    'SELECT id FROM main."rows"',
    'SELECT id FROM "rows" WHERE id > 1.5',
    'SELECT id FROM "rows" WHERE id > 1e3',
    'SELECT id FROM "rows" WHERE id = NULL',
    'SELECT id FROM "rows" WHERE id BETWEEN SYMMETRIC 5 AND 1',
    'SELECT id FROM "rows" WHERE id IN (SELECT id FROM "rows")',
    'SELECT id FROM "rows" WHERE body LIKE \'a%\'',
    'SELECT id FROM "rows" WHERE id > small',
    'SELECT * EXCLUDE (id) FROM "rows"',
    'SELECT ROW_NUMBER() OVER (ORDER BY id) AS n FROM "rows"',
    'SELECT CAST(id AS INT) AS n FROM "rows"',
    'SELECT CAST(id AS TEXT) FROM "rows"',
    'SELECT DISTINCT id FROM "rows"',
    'SELECT id FROM "rows" ORDER BY id',
    'SELECT id FROM "rows" LIMIT 1',
    'SELECT id + 1 AS id FROM "rows"',
    'SELECT rows.id FROM "rows" AS r',
    'SELECT a.id FROM "rows" AS a JOIN "rows" AS b ON a.id = b.id',
    'SELECT count(*) AS n FROM "rows"',
]


@pytest.mark.parametrize("sql", TAKEN)
def test_picked_columns_are_what_duckdb_returns(sql):
    relations = {"rows": ROWS}
    found = picks_of(parse_one(sql, read="duckdb"))
    assert found is not None
    picked = found.take(relations)
    with DuckDB() as db:
        expected = db.run(sql, relations)
    assert picked is not None
    assert picked.schema.equals(expected.schema, check_metadata=True)
    assert picked.equals(expected)


@pytest.mark.parametrize("sql", NOT_PICKS)
def test_other_statements_are_not_picks(sql):
    assert picks_of(parse_one(sql, read="duckdb")) is None


@pytest.mark.parametrize("column", OTHER_TYPES.schema.names)
def test_a_type_duckdb_changes_is_left_to_duckdb(column):
    found = picks_of(parse_one(f'SELECT "{column}" FROM t', read="duckdb"))
    assert found.take({"t": OTHER_TYPES}) is None


def test_a_name_of_no_one_column_is_left_to_duckdb():
    twice = pa.table({"a": [1], "A": [2]})
    assert picks_of(parse_one("SELECT a FROM t", read="duckdb")).take({"t": twice}) is None
    assert picks_of(parse_one("SELECT * FROM t", read="duckdb")).take({"t": twice}) is None
    assert picks_of(parse_one("SELECT b FROM t", read="duckdb")).take({"t": twice}) is None
    assert picks_of(parse_one("SELECT a FROM u", read="duckdb")).take({"t": twice}) is None


def test_a_non_nullable_field_comes_back_nullable_as_from_duckdb():
    strict = pa.table({"id": [1, 2]}, schema=pa.schema([pa.field("id", pa.int64(), nullable=False,
                                                                  metadata={b"k": b"v"})]))
    picked = picks_of(parse_one("SELECT id FROM t", read="duckdb")).take({"t": strict})
    with DuckDB() as db:
        expected = db.run("SELECT id FROM t", {"t": strict})
    assert picked.schema.equals(expected.schema, check_metadata=True)


@pytest.mark.parametrize("sql", [
    'SELECT id FROM "rows" WHERE body = 1',
    'SELECT id FROM "rows" WHERE id = \'1\'',
    'SELECT id FROM "rows" WHERE score > 0',
    'SELECT id FROM "rows" WHERE "day" > 0',
    'SELECT id FROM "rows" WHERE nothing IS NULL',
    'SELECT CAST(score AS TEXT) AS s FROM "rows"',
    'SELECT CAST("day" AS TEXT) AS s FROM "rows"',
])
def test_a_comparison_or_text_duckdb_may_make_otherwise_is_left_to_duckdb(sql):
    assert picks_of(parse_one(sql, read="duckdb")).take({"rows": ROWS}) is None


def test_all_columns_of_a_type_duckdb_changes_are_left_to_duckdb():
    assert picks_of(parse_one("SELECT * FROM t", read="duckdb")).take({"t": OTHER_TYPES}) is None
    unsigned = pa.table({"n": pa.array([1], pa.uint64())})
    assert picks_of(parse_one("SELECT n FROM t WHERE n > 0", read="duckdb")).take({"t": unsigned}) is None


def _many_rows() -> pa.Table:
    """Rows in several chunks, with NULLs, past one of DuckDB's row groups."""
    n = 150_000
    ids = pa.array([None if i % 97 == 0 else i for i in range(n)], pa.int32())
    names = pa.array([None if i % 89 == 0 else f"n{i % 1000:04d}" for i in range(n)])
    table = pa.table({"ID": ids, "name": names, "flag": [i % 3 == 0 for i in range(n)]})
    return pa.concat_tables([table.slice(0, 70_000), table.slice(70_000)])


@pytest.mark.parametrize("where", [
    "id BETWEEN 1000 AND 1099", "id < 5 OR id >= 149990", "NOT (id > 10) OR name = 'n0500'",
    "name IN ('n0001', 'n0999') AND id IS NOT NULL", "name >= 'n0990' AND NOT id BETWEEN 0 AND 140000",
    "id IS NULL", "id <> 7 AND id <= 20", "name < 'n0002' OR id IN (-1, 3)",
])
def test_picked_rows_are_duckdb_rows_in_duckdb_order(where):
    """The executor's rows statement (all columns, row numbers, arguments as text) over many rows, as DuckDB
    answers it, row for row, and over no rows (a result schema) as DuckDB types it."""
    sql = ('SELECT r.*, ROW_NUMBER() OVER () AS rid, CAST(r.name AS TEXT) AS a0, CAST(r.id AS TEXT) AS a1 '
           f'FROM t AS r WHERE {where}')
    found = picks_of(parse_one(sql, read="duckdb"))
    for rows in (_many_rows(), _many_rows().schema.empty_table()):
        picked = found.take({"t": rows})
        with DuckDB() as db:
            expected = db.run(sql, {"t": rows})
        assert picked is not None and picked.schema.equals(expected.schema, check_metadata=True)
        assert picked.equals(expected), where


def test_the_benchmark_queries_rows_picked_are_duckdb_s():
    """Every statement of the ten benchmark queries' plans that reads only stored tables (a table's rows for
    its AI steps) and is taken in Arrow gives DuckDB's rows, row for row; several are taken so."""
    from bench.datagen import Workload, generate
    from bench.run import ALL_QUERIES, query_text
    from quail.engine.exec.catalog import MemoryCatalog
    from quail.engine.exec.plan import SQLStep
    from quail.planner.planner import plan_sql

    tables = generate(Workload(0.002))
    catalog = MemoryCatalog()
    for name, table in tables.items():
        catalog.register(name, table)
    taken = 0
    for query in ALL_QUERIES:
        plan = plan_sql(query_text(query), catalog)
        for step in plan.steps:
            if not isinstance(step, SQLStep) or step.picks is None or step.picks.source not in tables:
                continue
            picked = step.picked(tables)
            if picked is not None:
                with DuckDB() as db:
                    expected = db.run(step.sql, tables)
                assert picked.schema.equals(expected.schema) and picked.equals(expected), (query, step.sql)
                taken += 1
    assert taken >= len(ALL_QUERIES)
