"""Flight SQL bulk ingest (CommandStatementIngest) as DuckDB statements over the ingested Arrow rows.

- The rows are registered on the call's connection and written by one
  statement: CREATE TABLE ... AS, CREATE OR REPLACE TABLE ... AS, or
  INSERT INTO ... BY NAME (columns matched by name; those not sent take their
  DEFAULT, or NULL). One statement is all or nothing.
- Arrow types become DuckDB's (a float stays a FLOAT, a decimal keeps its
  scale, a zoned timestamp is a TIMESTAMP WITH TIME ZONE); what DuckDB cannot
  store is converted where nothing is lost, else refused (storable.py);
  appended rows are cast to the table's types as an INSERT would cast them.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

from quail.engine.errors import AlreadyExists, InvalidArgument, NotFound
from quail.engine.exec.catalog import check_names
from quail.engine.exec.relational import duckdb_errors, quoted_name
from quail.engine.exec.storable import storable

SOURCE = "__quail_ingest"


def ingest(con: duckdb.DuckDBPyConnection, rows: pa.Table, table: str, schema: str | None, if_exists: str,
           if_missing: str, temporary: bool = False) -> int:
    """Write rows to `schema.table` (if_exists: fail, append or replace; if_missing: create or fail); the rows
    written. `temporary`: a temporary table, seen by this connection alone."""
    check_names(table, rows.schema.names)
    rows = storable(rows)
    lowered = [name.lower() for name in rows.schema.names]
    twins = sorted({name for name in rows.schema.names if lowered.count(name.lower()) > 1})
    if twins:
        raise InvalidArgument(f"columns {twins} differ only in case: SQL names are case-insensitive, so a table "
                              f"cannot hold both")
    where = "temp" if temporary else (schema or "main")
    target = f"{quoted_name(where)}.{quoted_name(table)}"
    with duckdb_errors():
        found = con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND lower(table_name) = ? "
                            "AND database_name = CASE WHEN ? THEN 'temp' ELSE current_database() END",
                            [where, table.lower(), temporary]).fetchall()[0][0]
        if not found and if_missing == "fail":
            raise NotFound(f"table {table!r} does not exist")
        if found and if_exists == "fail":
            raise AlreadyExists(f"table {table!r} already exists")
        temp = "TEMPORARY " if temporary else ""
        statement = (f"INSERT INTO {target} BY NAME SELECT * FROM {SOURCE}" if found and if_exists == "append" else
                     f"CREATE OR REPLACE {temp}TABLE {target} AS SELECT * FROM {SOURCE}" if found else
                     f"CREATE {temp}TABLE {target} AS SELECT * FROM {SOURCE}")
        con.register(SOURCE, rows)
        try:
            con.execute(statement)
        finally:
            con.unregister(SOURCE)
    return rows.num_rows
