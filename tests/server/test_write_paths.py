"""Every way a client writes rows or binds values, through the real drivers: what was sent is what is stored.

DB-API `execute()` of DDL and DML, `executemany`, prepared updates with
parameter batches, typed parameters, pandas `to_sql` and polars
`write_database` over ADBC; each checked by reading the rows back on another
connection.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import quail


@pytest.fixture(scope="module")
def uri(server) -> str:
    return server.uri


def _connect(uri: str):
    return flight_sql.connect(uri, autocommit=True)


def _read(uri: str, sql: str) -> list[tuple]:
    """Rows read back on a fresh connection."""
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


def test_ddl_and_dml_take_effect_when_execute_returns_without_a_fetch(uri):
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE unfetched (a INTEGER)")
        cur.execute("INSERT INTO unfetched VALUES (1), (2)")
        cur.execute("INSERT INTO unfetched SELECT a + 10 FROM unfetched")
        cur.execute("CREATE TABLE unfetched_copy AS SELECT a FROM unfetched WHERE a > 10")
    assert _read(uri, "SELECT a FROM unfetched ORDER BY a") == [(1,), (2,), (11,), (12,)]
    assert _read(uri, "SELECT a FROM unfetched_copy ORDER BY a") == [(11,), (12,)]
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.execute("DROP TABLE unfetched_copy")
        cur.execute("INSERT INTO unfetched VALUES (3)")
        cur.execute("SELECT count(*) FROM unfetched")  # a fetch after updates sees them
        assert cur.fetchone() == (5,)
    with pytest.raises(adbc_driver_manager.Error, match="NOT_FOUND"):
        _read(uri, "SELECT * FROM unfetched_copy")


def test_executemany_writes_every_row_as_sent(uri):
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE pm (id INTEGER, t VARCHAR)")
        cur.executemany("INSERT INTO pm VALUES (?, ?)", [(7, "sizing"), (8, "color fading"), (9, None)])
        assert cur.rowcount == 3
        cur.executemany("INSERT INTO pm (t, id) VALUES (?, ?)", [("by name", 10)])
        cur.executemany("INSERT INTO pm SELECT ? * 100, upper(?)", [(1, "a"), (2, "b")])
        assert cur.rowcount == 2
    assert _read(uri, "SELECT id, t FROM pm ORDER BY id") == [
        (7, "sizing"), (8, "color fading"), (9, None), (10, "by name"), (100, "A"), (200, "B")]


def test_prepared_statements_advertise_their_parameters(uri):
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS pm (id INTEGER, t VARCHAR)")
        assert len(cur.adbc_prepare("INSERT INTO pm VALUES (?, ?)")) == 2
        assert len(cur.adbc_prepare("SELECT id FROM pm WHERE id > ? AND t <> ?")) == 2
        assert len(cur.adbc_prepare("SELECT 1 AS x")) == 0


def test_a_statement_with_unbound_parameters_is_refused_not_run_with_nulls(uri):
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS pm (id INTEGER, t VARCHAR)")
        before = _read(uri, "SELECT count(*) FROM pm")
        for statement in ("INSERT INTO pm VALUES (?, ?)", "SELECT id FROM pm WHERE id = ?"):
            with pytest.raises(adbc_driver_manager.Error, match="INVALID_ARGUMENT.*no values were bound"):
                cur.execute(statement)
    assert _read(uri, "SELECT count(*) FROM pm") == before


@pytest.mark.parametrize("value", [
    float("nan"), float("inf"), -0.0, 1e-300, 2**63 - 1, -(2**63), decimal.Decimal("-1E-30"),
    decimal.Decimal("12345678901234567890.125"), dt.timedelta(days=2, microseconds=7), b"\x00\xff'",
    "it's ; DROP TABLE pm --", dt.date(1999, 12, 31), dt.time(23, 59, 58, 1),
    dt.datetime(2020, 1, 2, 3, 4, 5, 6), dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc), True, None,
], ids=repr)
def test_a_parameter_comes_back_as_bound(uri, value):
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.execute("SELECT ? AS v", (value,))
        table = cur.fetch_arrow_table()
    got = table.column("v")[0].as_py()
    if isinstance(value, dt.timedelta):  # SQL has intervals, not durations: days and the time within them
        assert (got.months, got.days, got.nanoseconds) == (0, value.days, (value - dt.timedelta(days=value.days))
                                                           // dt.timedelta(microseconds=1) * 1000)
    elif isinstance(value, float) and math.isnan(value):
        assert isinstance(got, float) and math.isnan(got)
    else:
        assert got == value and type(got) is type(value)
        if isinstance(value, decimal.Decimal):
            assert got.as_tuple() == value.as_tuple(), "the scale is kept"


def test_parameters_bind_in_the_order_written_at_any_depth(uri):
    """A `?` nested deeper than a later one, or in a CTE before the main query, takes its own value, in AI
    statements (bound as literals) and plain ones (numbered: Snowflake's LENGTH(?) repeats its argument in
    DuckDB); a function of overloads over a parameter prepares (octet_length(?))."""
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.adbc_ingest("ordered", pa.table({"id": [1, 2, 3, 4], "body": ["a", "b", "c", "d"]}), mode="create")
        cur.execute("SELECT id, AI_CLASSIFY(body, ['x', 'y']) AS c FROM ordered WHERE id >= abs(abs(?)) AND id <= ? "
                    "ORDER BY id", (2, 3))
        assert [row[0] for row in cur.fetchall()] == [2, 3]
        cur.execute("WITH c AS (SELECT ? AS a) SELECT a, ? AS b, length(?) AS n FROM c", (1, 2, "four"))
        assert cur.fetchall() == [(1, 2, 4)]
        cur.execute("SELECT octet_length(?) AS n", (b"\x00\x01\x02",))
        assert cur.fetchall() == [(3,)]


def test_typed_parameters_are_stored_exactly_by_executemany(uri):
    rows = [(1, float("nan"), decimal.Decimal("0.10")), (2, float("-inf"), decimal.Decimal("-1.25")),
            (3, None, None)]
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE typed (id BIGINT, x DOUBLE, d DECIMAL(10, 2))")
        cur.executemany("INSERT INTO typed VALUES (?, ?, ?)", rows)
    got = _read(uri, "SELECT id, x, d FROM typed ORDER BY id")
    assert math.isnan(got[0][1]) and got[1][1] == float("-inf") and got[2][1] is None
    assert [(r[0], r[2]) for r in got] == [(1, decimal.Decimal("0.10")), (2, decimal.Decimal("-1.25")), (3, None)]


def test_a_prompt_template_may_be_a_parameter(uri):
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.adbc_ingest("docs", pa.table({"id": [1, 2], "body": ["great food", "cold soup"]}), mode="replace")
        template = "Is {0} about food?"
        cur.execute("SELECT id, AI_SCORE(PROMPT(?, body)) AS s FROM docs ORDER BY id", (template,))
        bound = cur.fetchall()
        cur.execute(f"SELECT id, AI_SCORE(PROMPT('{template}', body)) AS s FROM docs ORDER BY id")
        inline = cur.fetchall()  # the same prompts, continuing the KV the first query left (round-off apart)
        assert [i for i, _ in bound] == [i for i, _ in inline] and [s for _, s in bound] == pytest.approx(
            [s for _, s in inline], rel=1e-4)


def test_pandas_and_polars_writers_store_what_they_wrote(uri):
    frame = pd.DataFrame({"id": [1, 2, 3], "note": ["a", None, "c'"], "x": [0.5, float("nan"), -1.0]})
    with _connect(uri) as conn:
        assert frame.to_sql("from_pandas", conn, index=False) == 3
        frame.iloc[:1].to_sql("from_pandas", conn, index=False, if_exists="append")
    assert _read(uri, "SELECT id, note, x FROM from_pandas ORDER BY id, x") == [
        (1, "a", 0.5), (1, "a", 0.5), (2, None, None), (3, "c'", -1.0)], "pandas writes NaN as NULL"
    back = pd.read_sql("SELECT id, note FROM from_pandas WHERE id > 1 ORDER BY id", _connect(uri))
    assert back["id"].tolist() == [2, 3] and back["note"].isna().tolist() == [True, False]

    polars_frame = pl.DataFrame({"id": [1, 2], "text": ["x", "y"], "d": [dt.date(2020, 1, 1), None]})
    with _connect(uri) as conn:
        assert polars_frame.write_database("from_polars", conn, engine="adbc") == 2
    with _connect(uri) as conn:
        read = pl.read_database("SELECT * FROM from_polars ORDER BY id", conn)
    assert read.to_dicts() == polars_frame.to_dicts()


def test_listed_schemas_are_what_queries_return(uri):
    """GetTables (ADBC's get_objects and get_table_schema) lists each column as a query returns it, with
    its SQL type name and table; a polars-written string view comes back, and is listed, a string. (ADBC's
    driver reads no nullability from Flight SQL's metadata: its xdbc_nullable stays NULL; the listed
    Arrow fields say nullable, as every result column is.)"""
    with _connect(uri) as conn:
        pl.DataFrame({"id": [1], "label": ["x"], "amount": [decimal.Decimal("1.50")]}).write_database(
            "views", conn, engine="adbc")
        for table in ("views", "quail_queries"):
            with conn.cursor() as cur:
                cur.execute(f"SELECT * FROM {table}")
                returned = cur.fetch_arrow_table().schema
            assert conn.adbc_get_table_schema(table) == returned, table
        objects = conn.adbc_get_objects(table_name_filter="views").read_all().to_pylist()
        (table,) = objects[0]["catalog_db_schemas"][0]["db_schema_tables"]
        columns = {c["column_name"]: c for c in table["table_columns"]}
        assert {n: c["xdbc_type_name"] for n, c in columns.items()} == {
            "id": "BIGINT", "label": "VARCHAR", "amount": "DECIMAL(38,2)"}
        assert all(c["xdbc_scope_schema"] == "main" and c["xdbc_scope_table"] == "views" for c in columns.values())
        assert all(field.nullable for field in conn.adbc_get_table_schema("views"))


def test_ingests_the_database_cannot_hold_are_refused_clearly(uri):
    """Columns differing only in case (SQL names are case-insensitive), and an ingest of no rows, which ADBC's
    driver sends as a stream of no messages at all (not even its command): clear errors, nothing written."""
    with _connect(uri) as conn, conn.cursor() as cur:
        with pytest.raises(adbc_driver_manager.Error, match="INVALID_ARGUMENT.*differ only in case"):
            cur.adbc_ingest("twins", pa.table({"x": [1], "X": [2]}), mode="create")
        with pytest.raises(adbc_driver_manager.Error, match="INVALID_ARGUMENT.*CREATE TABLE"):
            cur.adbc_ingest("nothing", pa.table({"id": pa.array([], pa.int64())}), mode="create")
        cur.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name IN ('twins', 'X', 'nothing')")
        assert cur.fetchall() == [(0,)]


@pytest.mark.parametrize("name, column, message", [
    ("wide_decimal", pa.array([decimal.Decimal("1.25")], pa.decimal256(40, 2)),
     "column 'a' is decimal256\\(40, 2\\): the database keeps decimals of at most 38 digits"),
    ("sparse", pa.UnionArray.from_sparse(pa.array([0, 1], pa.int8()), [pa.array([1, 2]), pa.array(["x", "y"])]),
     "column 'a' is a sparse_union.*stores no union"),
    ("dense", pa.UnionArray.from_dense(pa.array([0], pa.int8()), pa.array([0], pa.int32()), [pa.array([1])]),
     "column 'a' is a dense_union.*stores no union"),
    ("nanos", pa.array([1_001], pa.duration("ns")), "column 'a' .* finer than a microsecond"),
    ("month_nanos", pa.array([(1, 2, 3)], pa.month_day_nano_interval()), "finer than a microsecond"),
    ("nested_nanos", pa.array([[pa.scalar(1_001, pa.duration("ns")).as_py()]], pa.list_(pa.duration("ns"))),
     "finer than a microsecond"),
], ids=["decimal256-40", "sparse-union", "dense-union", "duration-ns", "month-day-nano", "nested"])
def test_an_ingest_of_what_the_database_cannot_store_is_refused_by_column(uri, name, column, message):
    with _connect(uri) as conn, conn.cursor() as cur:
        with pytest.raises(adbc_driver_manager.Error, match=f"INVALID_ARGUMENT.*{message}"):
            cur.adbc_ingest(name, pa.table({"a": column}), mode="create")
        with pytest.raises(adbc_driver_manager.Error, match="INVALID_ARGUMENT.*column 2 of the data has no name"):
            cur.adbc_ingest(name, pa.table({"b": [1], "": [2]}), mode="create")
        cur.execute(f"SELECT count(*) FROM duckdb_tables() WHERE table_name = '{name}'")
        assert cur.fetchall() == [(0,)]
        objects = conn.adbc_get_objects(depth="all").read_all()  # every user's listing still works
        assert objects.num_rows == 1


def test_an_ingest_converts_what_it_can_store_without_loss(uri):
    """Half floats become floats, a decimal256 of at most 38 digits a decimal, nested ones too, and
    nanosecond durations of whole microseconds an interval: every value read back equal to the one sent."""
    import numpy as np

    sent = pa.table({
        "half": pa.array(np.array([1.5, -2.25, 65504.0], dtype=np.float16)),
        "dec": pa.array([decimal.Decimal("12345678901234567.89"), None, decimal.Decimal("-0.01")],
                        pa.decimal256(20, 2)),
        "halves": pa.array([[np.float16(0.5)], None, []], pa.list_(pa.float16())),
        "span": pa.array([1_000, 2_000_000, None], pa.duration("ns")),
    })
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.adbc_ingest("converted", sent, mode="create")
        cur.execute("SELECT half, dec, halves, span FROM converted ORDER BY rowid")
        back = cur.fetch_arrow_table()
    assert [back.schema.field(n).type for n in ("half", "dec")] == [pa.float32(), pa.decimal128(20, 2)]
    assert back.schema.field("halves").type.value_type == pa.float32()
    assert back.column("half").to_pylist() == [1.5, -2.25, 65504.0]
    assert back.column("dec").to_pylist() == sent.column("dec").to_pylist()
    assert back.column("halves").to_pylist() == [[0.5], None, []]
    assert back.column("span").to_pylist()[2] is None
    assert [v.nanoseconds if v is not None else None for v in back.column("span").to_pylist()[:2]] == \
        [1_000, 2_000_000]


def test_a_view_that_no_longer_binds_is_listed_without_columns_and_breaks_no_listing(uri):
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE doomed AS SELECT 1 AS a")
        cur.execute("CREATE VIEW orphan AS SELECT a FROM doomed")
        cur.execute("DROP TABLE doomed")
        tables = {t["table_name"]: t for t in
                  conn.adbc_get_objects(depth="all").read_all().to_pylist()[0]["catalog_db_schemas"][0]["db_schema_tables"]}
        assert tables["orphan"]["table_columns"] == [] and tables["orphan"]["table_type"] == "VIEW"
        assert "quail_queries" in tables
        with pytest.raises(adbc_driver_manager.Error, match="doomed"):
            cur.execute("SELECT * FROM orphan")
        cur.execute("DROP VIEW orphan")


def test_ai_calls_in_update_delete_and_insert_give_what_the_two_step_query_gives(uri):
    """An UPDATE, a DELETE and an INSERT ... SELECT whose AI calls stand in SET, in WHERE under NOT and OR: the
    rows the same calls' answers, asked by a query first, give."""
    texts = ["Great pasta.", "Cold soup.", "A fine film.", None, "Rain all day."]
    classify = "AI_CLASSIFY(body, ['food', 'weather', 'film'])"
    food = "AI_FILTER(PROMPT('Is {0} about food?', body))"
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.adbc_ingest("notes", pa.table({"id": list(range(len(texts))), "body": texts}), mode="replace")
        cur.execute(f"SELECT id, {classify} AS c, {food} AS f FROM notes ORDER BY id")
        answers = {i: (c, f) for i, c, f in cur.fetchall()}
        cur.execute("ALTER TABLE notes ADD COLUMN label VARCHAR")
        cur.execute(f"UPDATE notes SET label = {classify} WHERE id < 3 AND label IS NULL")
        assert cur.fetchall() == [(3,)]
        cur.execute(f"INSERT INTO notes (id, body) SELECT id + 100, body FROM notes WHERE id = 4 OR {food}")
        cur.execute(f"DELETE FROM notes WHERE id < 100 AND NOT {food}")
        cur.execute("SELECT id, label FROM notes ORDER BY id")
        got = cur.fetchall()
    kept = [(i, answers[i][0] if i < 3 else None) for i in sorted(answers) if answers[i][1] is not False]
    added = [(i + 100, None) for i in sorted(answers) if i == 4 or answers[i][1] is True]
    assert got == kept + added


def test_a_view_whose_query_calls_ai_functions_runs_them_when_read(uri):
    """CREATE VIEW with an AI call: its query is Quail's to keep and plan when read (DuckDB knows no AI function),
    read like any view (by other views, CREATE TABLE ... AS, GetTables: an unaliased AI column listed by the
    name a read gives it), replaced and dropped as DuckDB's are; a second read asks the model about no new
    tokens of the same rows (the KV cache outlives queries)."""
    texts = ["Great pasta.", "Cold soup.", "A fine film."]
    score = "AI_SCORE(PROMPT('Is {0} about food?', body))"
    with quail.RemoteSession(uri) as session:
        session.register("dishes", pa.table({"id": [1, 2, 3], "body": texts}), replace=True)
        direct = session.sql(f"SELECT id, {score} AS s FROM dishes ORDER BY id").collect()
        session.sql(f"CREATE VIEW dish_scores AS SELECT id, {score} AS s FROM dishes").collect()
        first = session.sql("SELECT id, s FROM dish_scores ORDER BY id").run()
        again = session.sql("SELECT id, s FROM dish_scores ORDER BY id").run()
        assert first.collect()["id"] == direct["id"]
        assert first.collect()["s"].to_pylist() == pytest.approx(direct["s"].to_pylist(), rel=1e-4)
        assert again.report.fresh_tokens < again.report.logical_tokens / 2, "the rows' prompts were cached"
        session.sql("CREATE VIEW best_dish AS SELECT id FROM dish_scores ORDER BY s DESC LIMIT 1").collect()
        best = max(zip(direct["s"].to_pylist(), direct["id"].to_pylist()))[1]
        assert session.sql("SELECT * FROM best_dish").collect()["id"].to_pylist() == [best]
        session.sql("CREATE TABLE dish_snapshot AS SELECT * FROM dish_scores").collect()
        assert session.sql("SELECT count(*) AS n FROM dish_snapshot").collect()["n"].to_pylist() == [3]
        for clash in ("CREATE VIEW dish_scores AS SELECT 1 AS x", f"CREATE VIEW dishes AS SELECT {score} FROM dishes"):
            with pytest.raises(adbc_driver_manager.Error, match="ALREADY_EXISTS"):
                session.sql(clash).collect()
        tables = {t["table_name"]: t for t in session.connection.adbc_get_objects(
            table_name_filter="dish%").read_all().to_pylist()[0]["catalog_db_schemas"][0]["db_schema_tables"]}
        assert tables["dish_scores"]["table_type"] == "VIEW"
        assert [c["column_name"] for c in tables["dish_scores"]["table_columns"]] == ["id", "s"]
        flags = "SELECT id, ai_filter(prompt('Is {0} cold?', body)) FROM dishes"
        session.sql(f"CREATE VIEW dish_flags AS {flags}").collect()
        listed = session.connection.adbc_get_table_schema("dish_flags").names  # an AI column named as written
        assert listed == session.sql("SELECT * FROM dish_flags").collect().column_names == [
            "id", "ai_filter(prompt('Is {0} cold?', body))"]
        session.sql("DROP VIEW dish_flags").collect()
        session.sql("CREATE OR REPLACE VIEW dish_scores AS SELECT id, AI_FILTER(PROMPT('Is {0} cold?', body)) AS s "
                    "FROM dishes").collect()
        assert session.sql("SELECT s FROM dish_scores ORDER BY id").collect().schema.field("s").type == pa.bool_()
        session.sql("DROP VIEW best_dish").collect()
        session.sql("DROP VIEW dish_scores").collect()
        with pytest.raises(adbc_driver_manager.Error, match="NOT_FOUND"):
            session.sql("SELECT * FROM dish_scores").collect()


def test_keys_and_nullability_are_listed_as_the_database_declares_them(uri):
    """GetPrimaryKeys, GetImportedKeys, GetExportedKeys and GetCrossReference from the tables' constraints, in the
    spec's order; GetTables lists a NOT NULL column (a key's too) as non-nullable."""
    import pyarrow.flight as flight

    from quail.server import sql_messages as sql

    with _connect(uri) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE parents (a INTEGER, b VARCHAR, note VARCHAR, PRIMARY KEY (a, b))")
        cur.execute("CREATE TABLE children (id INTEGER PRIMARY KEY, pa INTEGER, pb VARCHAR, "
                    "FOREIGN KEY (pa, pb) REFERENCES parents (a, b))")
        assert [f.nullable for f in conn.adbc_get_table_schema("parents")] == [False, False, True]
    client = flight.FlightClient(uri)

    def listing(name: str, **fields) -> list[tuple]:
        info = client.get_flight_info(flight.FlightDescriptor.for_command(sql.pack(sql.new(name, **fields))))
        return [tuple(row.values()) for row in client.do_get(info.endpoints[0].ticket).read_all().to_pylist()]

    assert [row[2:6] for row in listing("CommandGetPrimaryKeys", table="parents")] == [
        ("parents", "a", "parents_a_b_pkey", 1), ("parents", "b", "parents_a_b_pkey", 2)]
    pairs = [("parents", "a", "children", "pa", 1), ("parents", "b", "children", "pb", 2)]
    for name, fields in (("CommandGetImportedKeys", {"table": "children"}),
                         ("CommandGetExportedKeys", {"table": "parents"}),
                         ("CommandGetCrossReference", {"pk_table": "parents", "fk_table": "children"})):
        assert [(r[2], r[3], r[6], r[7], r[8]) for r in listing(name, **fields)] == pairs, name
    assert listing("CommandGetImportedKeys", table="parents") == []
