"""Catalog RPC results with the Flight SQL spec's exact schemas (nullability included)."""

from __future__ import annotations

import re

import pyarrow as pa

import quail
from quail.engine.storage import TableStore
from quail.planner.binder import CATALOG_NAME, SCHEMA_NAME

from .ipc import schema_bytes

TABLE_TYPES = ("TABLE",)

CATALOGS_SCHEMA = pa.schema([pa.field("catalog_name", pa.utf8(), nullable=False)])
DB_SCHEMAS_SCHEMA = pa.schema([pa.field("catalog_name", pa.utf8()), pa.field("db_schema_name", pa.utf8(), nullable=False)])
TABLE_TYPES_SCHEMA = pa.schema([pa.field("table_type", pa.utf8(), nullable=False)])
_TABLES_FIELDS = [
    pa.field("catalog_name", pa.utf8()),
    pa.field("db_schema_name", pa.utf8()),
    pa.field("table_name", pa.utf8(), nullable=False),
    pa.field("table_type", pa.utf8(), nullable=False),
]
TABLES_SCHEMA = pa.schema(_TABLES_FIELDS)
TABLES_WITH_SCHEMA_SCHEMA = pa.schema(_TABLES_FIELDS + [pa.field("table_schema", pa.binary(), nullable=False)])

_INFO_CHILDREN = [
    pa.field("string_value", pa.utf8()),
    pa.field("bool_value", pa.bool_()),
    pa.field("bigint_value", pa.int64()),
    pa.field("int32_bitmask", pa.int32()),
    pa.field("string_list", pa.list_(pa.utf8())),
    pa.field("int32_to_int32_list_map", pa.map_(pa.int32(), pa.list_(pa.int32()))),
]
SQL_INFO_SCHEMA = pa.schema([
    pa.field("info_name", pa.uint32(), nullable=False),
    pa.field("value", pa.dense_union(_INFO_CHILDREN), nullable=False),
])
_STRING, _BOOL, _BIGINT, _INT32, _STRING_LIST = 0, 1, 2, 3, 4

# SqlInfo ids (FlightSql.proto) → (union member, value).
SQL_INFO = {
    0: (_STRING, "Quail"),                       # FLIGHT_SQL_SERVER_NAME
    1: (_STRING, quail.__version__),             # FLIGHT_SQL_SERVER_VERSION
    2: (_STRING, pa.__version__),                # FLIGHT_SQL_SERVER_ARROW_VERSION
    3: (_BOOL, False),                           # FLIGHT_SQL_SERVER_READ_ONLY
    4: (_BOOL, True),                            # FLIGHT_SQL_SERVER_SQL
    5: (_BOOL, False),                           # FLIGHT_SQL_SERVER_SUBSTRAIT
    8: (_INT32, 0),                              # FLIGHT_SQL_SERVER_TRANSACTION: none
    9: (_BOOL, False),                           # FLIGHT_SQL_SERVER_CANCEL
    10: (_BOOL, True),                           # FLIGHT_SQL_SERVER_BULK_INGESTION
    11: (_BOOL, False),                          # FLIGHT_SQL_SERVER_INGEST_TRANSACTIONS_SUPPORTED
    100: (_INT32, 0),                            # FLIGHT_SQL_SERVER_STATEMENT_TIMEOUT: none
    101: (_INT32, 0),                            # FLIGHT_SQL_SERVER_TRANSACTION_TIMEOUT: none
    500: (_BOOL, False),                         # SQL_DDL_CATALOG
    501: (_BOOL, False),                         # SQL_DDL_SCHEMA
    502: (_BOOL, False),                         # SQL_DDL_TABLE
    503: (_INT32, 1),                            # SQL_IDENTIFIER_CASE: case-insensitive
    504: (_STRING, '"'),                        # SQL_IDENTIFIER_QUOTE_CHAR
    505: (_INT32, 1),                            # SQL_QUOTED_IDENTIFIER_CASE: case-insensitive
    506: (_BOOL, True),                          # SQL_ALL_TABLES_ARE_SELECTABLE
    508: (_STRING_LIST, ["AI_FILTER", "PROMPT"]),  # SQL_KEYWORDS beyond SQL-92
    563: (_BOOL, False),                         # SQL_TRANSACTIONS_SUPPORTED
}


def like(pattern: str | None) -> re.Pattern[str]:
    """A SQL LIKE pattern (% and _, backslash escapes) as a full-match regex; None matches all."""
    if pattern is None:
        return re.compile(r".*", re.S)
    out, chars = [], iter(pattern)
    for ch in chars:
        if ch == "\\":
            out.append(re.escape(next(chars, "\\")))
        else:
            out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
    return re.compile("".join(out), re.S)


def catalogs() -> pa.Table:
    return pa.table({"catalog_name": [CATALOG_NAME]}, schema=CATALOGS_SCHEMA)


def db_schemas(catalog: str | None, schema_pattern: str | None) -> pa.Table:
    found = (catalog in (None, CATALOG_NAME)) and like(schema_pattern).fullmatch(SCHEMA_NAME)
    rows = [(CATALOG_NAME, SCHEMA_NAME)] if found else []
    return pa.Table.from_pylist([dict(zip(DB_SCHEMAS_SCHEMA.names, r)) for r in rows], schema=DB_SCHEMAS_SCHEMA)


def tables(store: TableStore, catalog: str | None, schema_pattern: str | None, name_pattern: str | None,
           table_types: list[str], include_schema: bool) -> pa.Table:
    schema = TABLES_WITH_SCHEMA_SCHEMA if include_schema else TABLES_SCHEMA
    rows = []
    if catalog in (None, CATALOG_NAME) and like(schema_pattern).fullmatch(SCHEMA_NAME) \
            and (not table_types or "TABLE" in table_types):
        names = like(name_pattern)
        for name in store.names():
            if names.fullmatch(name):
                row = {"catalog_name": CATALOG_NAME, "db_schema_name": SCHEMA_NAME, "table_name": name,
                       "table_type": "TABLE"}
                if include_schema:
                    row["table_schema"] = schema_bytes(store.schema(name))
                rows.append(row)
    return pa.Table.from_pylist(rows, schema=schema)


def table_types() -> pa.Table:
    return pa.table({"table_type": list(TABLE_TYPES)}, schema=TABLE_TYPES_SCHEMA)


def sql_info(ids: list[int]) -> pa.Table:
    """The requested SqlInfo rows (all known ones when ids is empty); unknown ids are skipped."""
    wanted = [i for i in (ids or sorted(SQL_INFO)) if i in SQL_INFO]
    children: list[list] = [[] for _ in _INFO_CHILDREN]
    kinds, offsets = [], []
    for info in wanted:
        kind, value = SQL_INFO[info]
        kinds.append(kind)
        offsets.append(len(children[kind]))
        children[kind].append(value)
    arrays = [pa.array(values, type=field.type) for values, field in zip(children, _INFO_CHILDREN)]
    union = pa.UnionArray.from_dense(pa.array(kinds, pa.int8()), pa.array(offsets, pa.int32()), arrays,
                                     [f.name for f in _INFO_CHILDREN])
    return pa.Table.from_arrays([pa.array(wanted, pa.uint32()), union], schema=SQL_INFO_SCHEMA)
