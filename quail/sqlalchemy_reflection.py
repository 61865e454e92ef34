"""What the SQLAlchemy dialect reflects, read over ADBC from a Quail server.

- Schemas, tables and views: ADBC `adbc_get_objects` (Flight SQL GetDbSchemas / GetTables), which lists what a
  client may read: Quail's views with AI calls among the views, its system table, not its own `__quail` tables.
- Columns: ADBC `adbc_get_table_schema` (GetTables' schema), each field's DuckDB type name (its Flight SQL
  `TYPE_NAME`) read as a SQLAlchemy type, nullable as the table says.
- Keys: DuckDB's `duckdb_constraints()`, a query the server answers (ADBC lists no constraints).
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import types as sqltypes
from sqlalchemy import util
from sqlalchemy.dialects.postgresql import ARRAY

from quail.remote import listed_tables

TYPE_NAME = b"ARROW:FLIGHT:SQL:TYPE_NAME"
TABLE_TYPES = ("TABLE", "SYSTEM TABLE")
VIEW_TYPES = ("VIEW",)

# DuckDB's names of its types (duckdb_types()' logical types, as its columns report them) → SQLAlchemy types.
SIMPLE_TYPES: dict[str, Any] = {
    "BIGINT": sqltypes.BIGINT, "INTEGER": sqltypes.INTEGER, "SMALLINT": sqltypes.SMALLINT,
    "TINYINT": sqltypes.SMALLINT, "UTINYINT": sqltypes.SMALLINT, "USMALLINT": sqltypes.INTEGER,
    "UINTEGER": sqltypes.BIGINT, "UBIGINT": sqltypes.NUMERIC, "HUGEINT": sqltypes.NUMERIC,
    "UHUGEINT": sqltypes.NUMERIC, "FLOAT": sqltypes.REAL, "DOUBLE": sqltypes.DOUBLE,
    "DECIMAL": sqltypes.DECIMAL, "VARCHAR": sqltypes.VARCHAR, "BOOLEAN": sqltypes.BOOLEAN, "DATE": sqltypes.DATE,
    "TIME": sqltypes.TIME, "TIMESTAMP": sqltypes.TIMESTAMP, "TIMESTAMP_S": sqltypes.TIMESTAMP,
    "TIMESTAMP_MS": sqltypes.TIMESTAMP, "TIMESTAMP_NS": sqltypes.TIMESTAMP, "BLOB": sqltypes.BLOB,
    "INTERVAL": sqltypes.Interval, "UUID": sqltypes.Uuid, "JSON": sqltypes.JSON,
}
ZONED_TYPES = {"TIMESTAMP WITH TIME ZONE": sqltypes.TIMESTAMP, "TIME WITH TIME ZONE": sqltypes.TIME}
DECIMAL = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)")
ARRAY_SUFFIX = re.compile(r"(.*)\[\d*\]")


def column_type(name: str) -> sqltypes.TypeEngine:
    """A DuckDB type name (`DECIMAL(10,2)`, `INTEGER[]`, `TIMESTAMP WITH TIME ZONE`) as a SQLAlchemy type;
    NullType, with a warning as SQLAlchemy's own dialects give, for one it has no type for (STRUCT, MAP, ...)."""
    upper = name.upper()
    if upper in ZONED_TYPES:
        return ZONED_TYPES[upper](timezone=True)
    if decimal := DECIMAL.fullmatch(upper):
        return sqltypes.DECIMAL(int(decimal[1]), int(decimal[2]))
    if array := ARRAY_SUFFIX.fullmatch(name):
        return ARRAY(column_type(array[1]))
    if upper in SIMPLE_TYPES:
        return SIMPLE_TYPES[upper]()
    util.warn(f"Did not recognize type {name!r}")
    return sqltypes.NullType()


def schema_names(adbc) -> list[str]:
    objects = adbc.adbc_get_objects(depth="db_schemas").read_all().to_pylist()
    return [schema["db_schema_name"] for catalog in objects for schema in catalog["catalog_db_schemas"]]


def table_names(adbc, schema: str, types: tuple[str, ...], name: str | None = None) -> list[str]:
    """The names of a schema's tables of the given types (the one named `name`, if it is one)."""
    return [table["name"] for table in listed_tables(adbc, schema, name, types)]


def columns(adbc, schema: str, table: str) -> list[dict[str, Any]]:
    """A table's or view's columns as SQLAlchemy's inspector gives them."""
    arrow = adbc.adbc_get_table_schema(table, db_schema_filter=schema)
    return [{"name": field.name, "type": column_type(field.metadata[TYPE_NAME].decode()),
             "nullable": field.nullable, "default": None} for field in arrow]


CONSTRAINTS = """
SELECT constraint_name, constraint_column_names, referenced_table, referenced_column_names
FROM duckdb_constraints() WHERE database_name = current_database() AND constraint_type = ?
AND schema_name = ? AND table_name = ? ORDER BY constraint_index
"""


def constraints(adbc, kind: str, schema: str, table: str) -> list[tuple]:
    """A table's constraints of one kind (`PRIMARY KEY`, `FOREIGN KEY`, `UNIQUE`): name, columns, the table and
    columns a foreign key references."""
    with adbc.cursor() as cursor:
        cursor.execute(CONSTRAINTS, (kind, schema, table))
        return cursor.fetchall()


def primary_key(adbc, schema: str, table: str) -> dict[str, Any]:
    found = constraints(adbc, "PRIMARY KEY", schema, table)
    name, keyed = (found[0][0], found[0][1]) if found else (None, [])
    return {"name": name, "constrained_columns": list(keyed)}


def foreign_keys(adbc, schema: str, table: str) -> list[dict[str, Any]]:
    return [{"name": name, "constrained_columns": list(keyed), "referred_schema": schema, "referred_table": referenced,
             "referred_columns": list(referred), "options": {}}
            for name, keyed, referenced, referred in constraints(adbc, "FOREIGN KEY", schema, table)]


def unique_constraints(adbc, schema: str, table: str) -> list[dict[str, Any]]:
    return [{"name": name, "column_names": list(keyed)}
            for name, keyed, _, _ in constraints(adbc, "UNIQUE", schema, table)]
