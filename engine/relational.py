"""Relational work in DuckDB over Arrow relations; DuckDB's errors become Quail errors."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Mapping

import duckdb
import pyarrow as pa

from .errors import InvalidArgument, NotFound


@contextmanager
def _duckdb(relations: Mapping[str, pa.Table]) -> Iterator[duckdb.DuckDBPyConnection]:
    """A fresh in-memory DuckDB without file access, the relations registered; its errors mapped."""
    con = duckdb.connect(config={"enable_external_access": False})
    try:
        for name, table in relations.items():
            con.register(name, table)
        yield con
    except duckdb.CatalogException as err:
        raise NotFound(str(err)) from None
    except duckdb.Error as err:
        raise InvalidArgument(str(err)) from None
    finally:
        con.close()


def run_sql(sql: str, relations: Mapping[str, pa.Table]) -> pa.Table:
    """Evaluate one statement over the named relations."""
    with _duckdb(relations) as con:
        return con.sql(sql).to_arrow_table()


def stream_sql(sql: str, relations: Mapping[str, pa.Table], rows_per_batch: int) -> Iterator[pa.RecordBatch]:
    """Evaluate one statement, its rows batch by batch as DuckDB produces them (memory bounded by a batch)."""
    with _duckdb(relations) as con:
        yield from con.sql(sql).to_arrow_reader(rows_per_batch)
