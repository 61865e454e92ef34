"""Values written through every path reach the database exactly: FLOAT, DOUBLE and DECIMAL compared by
equality after SQL literals, bound parameters (ADBC's, and flightsql-dbapi's dense unions), executemany,
prepared updates, Flight SQL ingest and the pandas and polars writers."""

from __future__ import annotations

import decimal

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest
from flightsql import FlightSQLClient, connect

import quail

FLOAT, DOUBLE, DECIMAL = 90.2, 0.1, decimal.Decimal("123.45")
TABLE = "CREATE TABLE {} (path VARCHAR, f FLOAT, d DOUBLE, dec DECIMAL(10, 2))"
EXACT = "SELECT count(*) FROM {} WHERE f = 90.2::FLOAT AND d = 0.1::DOUBLE AND dec = 123.45"


@pytest.fixture(scope="module")
def uri(server) -> str:
    return server.uri


def _connect(uri: str):
    """A connection whose statements are in DuckDB's dialect (in Snowflake's, FLOAT is a DOUBLE)."""
    return quail.connect(uri, dialect="duckdb")


def _check(uri: str, table: str, rows: int) -> None:
    """Every row holds the values exactly: equal to the literals in SQL, and read back as written."""
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.execute(EXACT.format(table))
        assert cur.fetchone() == (rows,), table
        cur.execute(f"SELECT DISTINCT f, d, dec FROM {table}")
        assert cur.fetchall() == [(float(np.float32(FLOAT)), DOUBLE, DECIMAL)]


def _fresh(uri: str, name: str) -> None:
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.execute(TABLE.format(name))


def test_literals_in_insert_values_and_insert_select(uri):
    _fresh(uri, "by_literal")
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO by_literal VALUES ('values', 90.2, 0.1, 123.45)")
        cur.execute("INSERT INTO by_literal SELECT 'select', 90.2, 0.1, 123.45")
        cur.execute("INSERT INTO by_literal (dec, d, f, path) VALUES (123.45, 0.1, 90.2, 'columns')")
        cur.execute("UPDATE by_literal SET f = 90.2, d = 0.1, dec = 123.450 WHERE path = 'columns'")
    _check(uri, "by_literal", 3)


def test_bound_parameters_executemany_and_prepared_updates(uri):
    _fresh(uri, "by_parameter")
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO by_parameter VALUES (?, ?, ?, ?)", ("one", FLOAT, DOUBLE, DECIMAL))
        cur.executemany("INSERT INTO by_parameter VALUES (?, ?, ?, ?)", [("many", FLOAT, DOUBLE, DECIMAL)] * 3)
        typed = pa.table({"p": ["float32"], "f": pa.array([FLOAT], pa.float32()), "d": [DOUBLE],
                          "dec": pa.array([DECIMAL], pa.decimal128(10, 2))})
        cur.adbc_prepare("INSERT INTO by_parameter VALUES (?, ?, ?, ?)")
        cur.executemany("INSERT INTO by_parameter VALUES (?, ?, ?, ?)", typed)
    _check(uri, "by_parameter", 5)


def test_flight_sql_ingest_create_and_append(uri):
    rows = pa.table({"path": ["ingest"], "f": pa.array([FLOAT], pa.float32()), "d": [DOUBLE],
                     "dec": pa.array([DECIMAL], pa.decimal128(10, 2))})
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.adbc_ingest("by_ingest", rows, mode="create")
        cur.adbc_ingest("by_ingest", rows.cast(pa.schema([("path", pa.large_string()), ("f", pa.float64()),
                                                          ("d", pa.float64()), ("dec", pa.decimal128(20, 4))])),
                        mode="append")  # wider types, cast to the table's as an INSERT casts
        cur.adbc_ingest("by_ingest", rows.select(["dec", "d", "f", "path"]), mode="append")  # matched by name
    _check(uri, "by_ingest", 3)


def test_pandas_and_polars_writers(uri):
    _fresh(uri, "by_frames")
    frame = pd.DataFrame({"path": ["pandas"], "f": np.array([FLOAT], np.float32), "d": [DOUBLE], "dec": [DECIMAL]})
    with _connect(uri) as conn:
        frame.to_sql("by_frames", conn, index=False, if_exists="append")
        pl.DataFrame({"path": ["polars"], "f": pl.Series([FLOAT], dtype=pl.Float32), "d": [DOUBLE],
                      "dec": pl.Series([DECIMAL], dtype=pl.Decimal(10, 2))}).write_database(
            "by_frames", conn, engine="adbc", if_table_exists="append")
    _check(uri, "by_frames", 2)


def test_flightsql_dbapi_parameters_sent_as_dense_unions(uri):
    """flightsql-dbapi sends each parameter as a dense union of types: in an INSERT as in a SELECT."""
    _fresh(uri, "by_union")
    host, port = uri.removeprefix("grpc://").rsplit(":", 1)
    client = FlightSQLClient(host=host, port=int(port), insecure=True)
    try:
        with connect(client).cursor() as cur:
            cur.execute("INSERT INTO by_union VALUES (?, ?, ?, 123.45)", ["union", FLOAT, DOUBLE])
            cur.execute("SELECT count(*) FROM by_union WHERE d = ? AND path = ?", [DOUBLE, "union"])
            assert [tuple(r) for r in cur.fetchall()] == [(1,)]
    finally:
        client.close()
    _check(uri, "by_union", 1)


def test_every_type_comes_back_as_ingested_and_as_bound(uri):
    """Nested, temporal, binary and decimal values through ingest and back, equal; the same values bound as
    parameters of an INSERT, equal again (DuckDB's Arrow types where it names them otherwise)."""
    import datetime as dt

    rows = pa.table({
        "tags": pa.array([["a", "b"], [], None], pa.list_(pa.string())),
        "point": pa.array([{"x": 1, "y": 2.5}, None, {"x": -1, "y": 0.0}],
                          pa.struct([("x", pa.int32()), ("y", pa.float64())])),
        "attrs": pa.array([[("k", 1)], [], None], pa.map_(pa.string(), pa.int64())),
        "raw": pa.array([b"\x00\xff", b"", None], pa.binary()),
        "at": pa.array([dt.time(0, 0, 1), dt.time(23, 59, 59, 999999), None], pa.time64("us")),
        "zoned": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)] * 2 + [None],
                          pa.timestamp("us", "UTC")),
        "amount": pa.array([decimal.Decimal("123.45"), decimal.Decimal("-0.01"), None], pa.decimal128(10, 2)),
        "day": pa.array([dt.date(2020, 2, 29), None, dt.date(1, 1, 1)], pa.date32()),
    })
    with _connect(uri) as conn, conn.cursor() as cur:
        cur.adbc_ingest("typed_rows", rows, mode="create")
        cur.execute("SELECT * FROM typed_rows")
        back = cur.fetch_arrow_table()
        cur.execute("CREATE TABLE typed_bound AS SELECT * FROM typed_rows WHERE false")
        cur.executemany("INSERT INTO typed_bound VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
        cur.execute("SELECT * FROM typed_bound")
        bound = cur.fetch_arrow_table()
    assert back.to_pylist() == rows.to_pylist() and bound.to_pylist() == rows.to_pylist()
