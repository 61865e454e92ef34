"""Relational work in DuckDB over Arrow relations; DuckDB's errors become Quail errors."""

from __future__ import annotations

from typing import Mapping

import duckdb
import pyarrow as pa

from .errors import InvalidArgument, NotFound


def run_sql(sql: str, relations: Mapping[str, pa.Table]) -> pa.Table:
    """Evaluate one statement over the named relations in a fresh in-memory DuckDB without file access."""
    con = duckdb.connect(config={"enable_external_access": False})
    try:
        for name, table in relations.items():
            con.register(name, table)
        return con.sql(sql).to_arrow_table()
    except duckdb.CatalogException as err:
        raise NotFound(str(err)) from None
    except duckdb.Error as err:
        raise InvalidArgument(str(err)) from None
    finally:
        con.close()
