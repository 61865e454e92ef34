"""The SQLAlchemy dialect against a real server: URLs, the inspector, bound parameters, pandas, transactions."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import numpy as np
import pandas as pd
import pytest
from flightsql import FlightSQLClient, TableRef
from sqlalchemy import MetaData, Numeric, Table, create_engine, exc, inspect, select, text, types
from sqlalchemy.dialects import registry
from sqlalchemy.engine import make_url

from quail import remote
from quail.clients.server_process import ServerProcess
from quail.sqlalchemy_dialect import QuailDialect, QuailTLSDialect
from tests.tls_certs import self_signed

SETUP = [
    "CREATE TABLE notes (id INTEGER PRIMARY KEY, body VARCHAR NOT NULL, stars DOUBLE, price DECIMAL(8, 2), "
    "seen TIMESTAMP WITH TIME ZONE, tags VARCHAR[])",
    "INSERT INTO notes VALUES (1, 'Fresh bread and a strong espresso for breakfast.', 5, 3.50, NULL, ['food']), "
    "(2, 'The train was forty minutes late.', 2, NULL, NULL, NULL), "
    "(3, 'A bowl of ramen with a soft egg.', 4, 12.00, NULL, ['food', 'noodles']), "
    "(4, 'The printer jammed twice this morning.', NULL, NULL, NULL, NULL)",
    "CREATE VIEW starred AS SELECT id, body FROM notes WHERE stars >= 4",
    "CREATE SCHEMA shop",
    "CREATE TABLE shop.lines (order_id BIGINT, line SMALLINT, PRIMARY KEY (order_id, line))",
    "CREATE TABLE tagged (note_id INTEGER REFERENCES notes (id), tag VARCHAR UNIQUE)",  # keys within a schema
]
FOOD = "SELECT id FROM notes WHERE AI_FILTER(PROMPT('Is this text about food? {0}', body)) ORDER BY id"


def quail_url(uri: str) -> str:
    return uri.replace("grpc://", "quail://").replace("grpc+tls://", "quail+tls://")


@pytest.fixture(scope="module")
def engine(server):
    with remote.connect(server.uri, dialect="duckdb") as conn, conn.cursor() as cursor:
        for statement in SETUP:
            cursor.execute(statement)
    made = create_engine(quail_url(server.uri))
    yield made
    made.dispose()


def listed(server) -> dict[str, dict[str, dict]]:
    """ADBC's get_objects: each schema's tables, each with its type and columns' type names."""
    with remote.connect(server.uri) as conn:
        objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
    return {schema["db_schema_name"]: {table["table_name"]: table for table in schema["db_schema_tables"] or []}
            for catalog in objects for schema in catalog["catalog_db_schemas"]}


def test_entry_points_name_the_dialects():
    assert registry.load("quail") is QuailDialect
    assert registry.load("quail.tls") is QuailTLSDialect


def test_url_gives_the_uri_login_and_tls_options(tmp_path):
    cert, _ = self_signed(tmp_path)
    url = make_url(f"quail+tls://ann:s%40cret@db.example:9000?tls_root_certs={cert}&tls_skip_verify=false")
    args, options = create_engine(url).dialect.create_connect_args(url)
    assert args == ["grpc+tls://db.example:9000"]
    assert options == {"username": "ann", "password": "s@cret",
                       "adbc.flight.sql.client_option.tls_root_certs": cert.read_text()}
    plain = make_url("quail://localhost")
    assert create_engine(plain).dialect.create_connect_args(plain) == (["grpc://localhost:8815"], {})
    with pytest.raises(exc.ArgumentError, match="unknown quail URL option 'dialect'"):
        odd = make_url("quail://localhost?dialect=bigquery")
        create_engine(odd).dialect.create_connect_args(odd)


def test_inspector_lists_what_adbc_lists(engine, server):
    objects, inspector = listed(server), inspect(engine)
    assert inspector.get_schema_names() == sorted(objects) == ["main", "shop"]
    for schema, tables in objects.items():
        assert inspector.get_table_names(schema) == sorted(name for name, table in tables.items()
                                                           if table["table_type"] != "VIEW")
        assert inspector.get_view_names(schema) == sorted(name for name, table in tables.items()
                                                          if table["table_type"] == "VIEW")
    assert inspector.get_view_names() == ["starred"]
    assert "quail_queries" in inspector.get_table_names()  # the system table, which a client may read
    for schema, table in (("main", "notes"), ("main", "starred"), ("shop", "lines")):
        columns = inspector.get_columns(table, schema)
        assert [(c["name"], c["type"].compile(dialect=engine.dialect).replace(", ", ",")) for c in columns] == \
            [(c["column_name"], c["xdbc_type_name"]) for c in objects[schema][table]["table_columns"]]


def test_inspector_gives_types_nullability_and_keys(engine, server):
    inspector = inspect(engine)
    columns = {c["name"]: c for c in inspector.get_columns("notes")}
    expected = {"id": types.INTEGER, "body": types.VARCHAR, "stars": types.DOUBLE, "price": types.DECIMAL,
                "seen": types.TIMESTAMP, "tags": types.ARRAY}
    assert list(columns) == list(expected)
    assert all(isinstance(columns[name]["type"], kind) for name, kind in expected.items())
    assert (columns["price"]["type"].precision, columns["price"]["type"].scale) == (8, 2)
    assert columns["seen"]["type"].timezone and type(columns["tags"]["type"].item_type) is types.VARCHAR
    assert {name: c["nullable"] for name, c in columns.items()} == \
        {"id": False, "body": False, "stars": True, "price": True, "seen": True, "tags": True}
    host, port = server.uri.removeprefix("grpc://").rsplit(":", 1)
    client = FlightSQLClient(host=host, port=int(port), insecure=True)
    for schema, table in (("main", "notes"), ("shop", "lines")):
        info = client.get_primary_keys(TableRef(db_schema=schema, table=table))
        keys = client.do_get(info.endpoints[0].ticket).read_all().to_pylist()
        assert inspector.get_pk_constraint(table, schema) == {
            "name": keys[0]["key_name"], "constrained_columns": [key["column_name"] for key in keys]}
    client.close()
    assert inspector.get_pk_constraint("lines", "shop")["constrained_columns"] == ["order_id", "line"]
    assert [(fk["constrained_columns"], fk["referred_table"], fk["referred_columns"])
            for fk in inspector.get_foreign_keys("tagged")] == [(["note_id"], "notes", ["id"])]
    assert [u["column_names"] for u in inspector.get_unique_constraints("tagged")] == [["tag"]]
    assert inspector.has_table("notes") and inspector.has_table("starred") and not inspector.has_table("not_es")


def test_read_sql_binds_parameters(engine):
    query = text("SELECT id FROM notes WHERE stars >= :lo ORDER BY id")
    assert pd.read_sql(query, engine, params={"lo": 3})["id"].tolist() == [1, 3]
    assert pd.read_sql(query, engine, params={"lo": None}).empty, "NULL compares as NULL: no row"
    nulls = pd.read_sql(text("SELECT :p IS NULL AS is_null, :q AS q"), engine, params={"p": None, "q": "it's"})
    assert nulls.to_dict("records") == [{"is_null": True, "q": "it's"}]


def records(frame: pd.DataFrame) -> list[tuple]:
    return [tuple(None if pd.isna(value) else value for value in row) for row in frame.itertuples(index=False)]


def test_to_sql_round_trips_every_common_type(engine):
    frame = pd.DataFrame({
        "i64": pd.array([1, None, 2**40], dtype="Int64"),
        "i32": pd.array([1, None, -7], dtype="Int32"),
        "f64": [0.1, np.nan, 1e300],
        "f32": np.array([0.1, np.nan, 3.4e38], dtype="float32"),
        "b": pd.array([True, None, False], dtype="boolean"),
        "s": ["a", None, "ü 'quoted'"],
        "ts": pd.to_datetime(["2024-01-02 03:04:05.123456", None, "1999-12-31 00:00:00.5"], format="ISO8601"),
        "tz": pd.to_datetime(["2024-01-02 03:04:05.123456+00:00", None, "1999-12-31 23:00:00-01:00"], utc=True,
                             format="ISO8601"),
        "d": [dt.date(2024, 1, 2), None, dt.date(1970, 1, 1)],
        "dec": [Decimal("1.25"), None, Decimal("-99999999.99")],
    })
    assert frame.to_sql("every_type", engine, index=False, dtype={"dec": Numeric(10, 2)}) == 3
    stored = {column["name"]: column["type"].compile(dialect=engine.dialect)
              for column in inspect(engine).get_columns("every_type")}
    assert stored == {"i64": "BIGINT", "i32": "INTEGER", "f64": "DOUBLE", "f32": "REAL", "b": "BOOLEAN",
                      "s": "VARCHAR", "ts": "TIMESTAMP WITHOUT TIME ZONE", "tz": "TIMESTAMP WITH TIME ZONE",
                      "d": "DATE", "dec": "DECIMAL(10, 2)"}
    back = pd.read_sql(text("SELECT * FROM every_type"), engine, coerce_float=False)
    assert records(back) == records(frame)
    assert back["f32"].tolist()[0] == float(np.float32(0.1)), "float32 values come back exactly"


def test_to_sql_replace_and_append(engine):
    pd.DataFrame({"x": [1, 2]}).to_sql("grown", engine, index=False)
    with pytest.raises(ValueError, match="already exists"):
        pd.DataFrame({"x": [3]}).to_sql("grown", engine, index=False)
    pd.DataFrame({"x": [3]}).to_sql("grown", engine, index=False, if_exists="append")
    assert pd.read_sql_table("grown", engine)["x"].tolist() == [1, 2, 3]
    pd.DataFrame({"y": ["z"]}).to_sql("grown", engine, index=False, if_exists="replace")
    assert pd.read_sql_table("grown", engine).to_dict("records") == [{"y": "z"}]


def test_a_failed_transaction_rolls_back_and_a_committed_one_is_seen(engine):
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE ledger (n INTEGER)"))
        conn.execute(text("INSERT INTO ledger VALUES (1)"))
    with pytest.raises(RuntimeError), engine.begin() as conn:
        conn.execute(text("INSERT INTO ledger VALUES (2)"))
        assert conn.execute(text("SELECT count(*) FROM ledger")).scalar() == 2, "it sees its own write"
        raise RuntimeError("undo")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT n FROM ledger")).all() == [(1,)]
        notes = conn.execute(text("UPDATE notes SET stars = stars WHERE stars >= :lo"), {"lo": 4})
        assert notes.all() == [(2,)], "a text update answers its count of rows"
        conn.rollback()


def test_core_updates_count_rows_and_autocommit_skips_transactions(engine):
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE ledger2 (n INTEGER PRIMARY KEY, v VARCHAR)"))
    table = Table("ledger2", MetaData(), autoload_with=engine)
    assert [c.name for c in table.primary_key] == ["n"]
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(table.insert(), [{"n": 1, "v": "a"}, {"n": 2, "v": None}])
        assert conn.execute(table.update().where(table.c.n >= 1).values(v="b")).rowcount == 2
        assert conn.execute(table.insert().values(n=3, v="c").returning(table.c.n)).all() == [(3,)]
    with engine.connect() as conn:
        assert conn.execute(select(table.c.v).order_by(table.c.n)).scalars().all() == ["b", "b", "c"]


def test_ai_query_passes_through(engine, server):
    with remote.connect(server.uri, dialect="duckdb") as conn, conn.cursor() as cursor:
        cursor.execute(FOOD)
        expected = [row[0] for row in cursor.fetchall()]
    assert pd.read_sql(text(FOOD), engine)["id"].tolist() == expected


def test_login_and_tls_from_the_url(tmp_path):
    users = tmp_path / "users"
    users.write_text("ann:s3cret\n")
    cert, key = self_signed(tmp_path)
    with ServerProcess(tmp_path / "data", "--users", str(users), "--tls-cert", str(cert),
                       "--tls-key", str(key)) as secured:
        address = secured.uri.removeprefix("grpc+tls://")
        good = create_engine(f"quail+tls://ann:s3cret@{address}?tls_root_certs={cert}")
        with good.connect() as conn:
            assert conn.execute(text("SELECT 41 + :one AS x"), {"one": 1}).all() == [(42,)]
        good.dispose()
        wrong = create_engine(f"quail+tls://ann:wrong@{address}?tls_root_certs={cert}")
        with pytest.raises(exc.DBAPIError, match="UNAUTHENTICATED"):
            wrong.connect()
