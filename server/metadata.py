"""Catalog RPC results with the Flight SQL spec's exact schemas (nullability included)."""

from __future__ import annotations

import functools
import logging
import re

import duckdb
import pyarrow as pa
from google.protobuf.message import Message

import quail
from quail.engine.ai.kinds import SQL_NAMES
from quail.engine.errors import QuailError
from quail.engine.exec.catalog import AIView
from quail.engine.exec.database import ai_views, objects
from quail.engine.exec.relational import duckdb_errors, keywords, quoted_name, result_columns, statement_schema
from quail.planner.binder import CATALOG_NAME, SCHEMA_NAME, is_text
from quail.planner.substrait.producer import SUBSTRAIT_VERSION

from quail.server.ipc import schema_bytes
from quail.server.sql_messages import optional

log = logging.getLogger("quail.server")

TABLE_TYPES = ("SYSTEM TABLE", "TABLE", "VIEW")

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

SQL_92 = frozenset("""
ABSOLUTE ACTION ADD ALL ALLOCATE ALTER AND ANY ARE AS ASC ASSERTION AT AUTHORIZATION AVG BEGIN BETWEEN BIT
BIT_LENGTH BOTH BY CASCADE CASCADED CASE CAST CATALOG CHAR CHARACTER CHAR_LENGTH CHARACTER_LENGTH CHECK CLOSE
COALESCE COLLATE COLLATION COLUMN COMMIT CONNECT CONNECTION CONSTRAINT CONSTRAINTS CONTINUE CONVERT CORRESPONDING
COUNT CREATE CROSS CURRENT CURRENT_DATE CURRENT_TIME CURRENT_TIMESTAMP CURRENT_USER CURSOR DATE DAY DEALLOCATE DEC
DECIMAL DECLARE DEFAULT DEFERRABLE DEFERRED DELETE DESC DESCRIBE DESCRIPTOR DIAGNOSTICS DISCONNECT DISTINCT DOMAIN
DOUBLE DROP ELSE END END-EXEC ESCAPE EXCEPT EXCEPTION EXEC EXECUTE EXISTS EXTERNAL EXTRACT FALSE FETCH FIRST FLOAT
FOR FOREIGN FOUND FROM FULL GET GLOBAL GO GOTO GRANT GROUP HAVING HOUR IDENTITY IMMEDIATE IN INDICATOR INITIALLY
INNER INPUT INSENSITIVE INSERT INT INTEGER INTERSECT INTERVAL INTO IS ISOLATION JOIN KEY LANGUAGE LAST LEADING LEFT
LEVEL LIKE LOCAL LOWER MATCH MAX MIN MINUTE MODULE MONTH NAMES NATIONAL NATURAL NCHAR NEXT NO NOT NULL NULLIF
NUMERIC OCTET_LENGTH OF ON ONLY OPEN OPTION OR ORDER OUTER OUTPUT OVERLAPS PAD PARTIAL POSITION PRECISION PREPARE
PRESERVE PRIMARY PRIOR PRIVILEGES PROCEDURE PUBLIC READ REAL REFERENCES RELATIVE RESTRICT REVOKE RIGHT ROLLBACK
ROWS SCHEMA SCROLL SECOND SECTION SELECT SESSION SESSION_USER SET SIZE SMALLINT SOME SPACE SQL SQLCODE SQLERROR
SQLSTATE SUBSTRING SUM SYSTEM_USER TABLE TEMPORARY THEN TIME TIMESTAMP TIMEZONE_HOUR TIMEZONE_MINUTE TO TRAILING
TRANSACTION TRANSLATE TRANSLATION TRIM TRUE UNION UNIQUE UNKNOWN UPDATE UPPER USAGE USER USING VALUE VALUES
VARCHAR VARYING VIEW WHEN WHENEVER WHERE WITH WORK WRITE YEAR ZONE
""".split())  # SQL-92's reserved words
AI_KEYWORDS = (*(name for name in SQL_NAMES if "." not in name), "PROMPT")


def sql_keywords() -> list[str]:
    """SqlInfo SQL_KEYWORDS: the words Quail's SQL reserves or treats specially that SQL-92 does not (DuckDB's
    keywords and the AI functions), sorted."""
    return sorted((keywords() | set(AI_KEYWORDS)) - SQL_92)


# SqlInfo ids (FlightSql.proto) → (union member, value).
SQL_INFO = {
    0: (_STRING, "Quail"),                       # FLIGHT_SQL_SERVER_NAME
    1: (_STRING, quail.__version__),             # FLIGHT_SQL_SERVER_VERSION
    2: (_STRING, pa.__version__),                # FLIGHT_SQL_SERVER_ARROW_VERSION
    3: (_BOOL, False),                           # FLIGHT_SQL_SERVER_READ_ONLY
    4: (_BOOL, True),                            # FLIGHT_SQL_SERVER_SQL
    5: (_BOOL, True),                            # FLIGHT_SQL_SERVER_SUBSTRAIT
    6: (_STRING, SUBSTRAIT_VERSION),             # FLIGHT_SQL_SERVER_SUBSTRAIT_MIN_VERSION: the one plans are read in
    7: (_STRING, SUBSTRAIT_VERSION),             # FLIGHT_SQL_SERVER_SUBSTRAIT_MAX_VERSION
    8: (_INT32, 1),                              # FLIGHT_SQL_SERVER_TRANSACTION: transactions, no savepoints
    9: (_BOOL, True),                            # FLIGHT_SQL_SERVER_CANCEL
    10: (_BOOL, True),                           # FLIGHT_SQL_SERVER_BULK_INGESTION
    11: (_BOOL, True),                           # FLIGHT_SQL_SERVER_INGEST_TRANSACTIONS_SUPPORTED
    100: (_INT32, 0),                            # FLIGHT_SQL_SERVER_STATEMENT_TIMEOUT: none
    101: (_INT32, 0),                            # FLIGHT_SQL_SERVER_TRANSACTION_TIMEOUT: none
    500: (_BOOL, False),                         # SQL_DDL_CATALOG
    501: (_BOOL, True),                          # SQL_DDL_SCHEMA
    502: (_BOOL, True),                          # SQL_DDL_TABLE
    503: (_INT32, 1),                            # SQL_IDENTIFIER_CASE: case-insensitive
    504: (_STRING, '"'),                        # SQL_IDENTIFIER_QUOTE_CHAR
    505: (_INT32, 1),                            # SQL_QUOTED_IDENTIFIER_CASE: case-insensitive
    506: (_BOOL, True),                          # SQL_ALL_TABLES_ARE_SELECTABLE
    508: (_STRING_LIST, sql_keywords()),         # SQL_KEYWORDS beyond SQL-92
    562: (_INT32, 4),                            # SQL_DEFAULT_TRANSACTION_ISOLATION: serializable (DuckDB's MVCC)
    563: (_BOOL, True),                          # SQL_TRANSACTIONS_SUPPORTED
    564: (_INT32, 1 << 4),                       # SQL_SUPPORTED_TRANSACTIONS_ISOLATION_LEVELS: serializable
    565: (_BOOL, False),                         # SQL_DATA_DEFINITION_CAUSES_TRANSACTION_COMMIT
    566: (_BOOL, False),                         # SQL_DATA_DEFINITIONS_IN_TRANSACTIONS_IGNORED
}


_KEY_FIELDS = [
    pa.field("pk_catalog_name", pa.utf8()), pa.field("pk_db_schema_name", pa.utf8()),
    pa.field("pk_table_name", pa.utf8(), nullable=False), pa.field("pk_column_name", pa.utf8(), nullable=False),
    pa.field("fk_catalog_name", pa.utf8()), pa.field("fk_db_schema_name", pa.utf8()),
    pa.field("fk_table_name", pa.utf8(), nullable=False), pa.field("fk_column_name", pa.utf8(), nullable=False),
    pa.field("key_sequence", pa.int32(), nullable=False), pa.field("fk_key_name", pa.utf8()),
    pa.field("pk_key_name", pa.utf8()), pa.field("update_rule", pa.uint8(), nullable=False),
    pa.field("delete_rule", pa.uint8(), nullable=False),
]
FOREIGN_KEYS_SCHEMA = pa.schema(_KEY_FIELDS)  # GetImportedKeys, GetExportedKeys, GetCrossReference
PRIMARY_KEYS_SCHEMA = pa.schema([
    pa.field("catalog_name", pa.utf8()), pa.field("db_schema_name", pa.utf8()),
    pa.field("table_name", pa.utf8(), nullable=False), pa.field("column_name", pa.utf8(), nullable=False),
    pa.field("key_name", pa.utf8()), pa.field("key_sequence", pa.int32(), nullable=False),
])
XDBC_TYPE_INFO_SCHEMA = pa.schema([
    pa.field("type_name", pa.utf8(), nullable=False), pa.field("data_type", pa.int32(), nullable=False),
    pa.field("column_size", pa.int32()), pa.field("literal_prefix", pa.utf8()), pa.field("literal_suffix", pa.utf8()),
    pa.field("create_params", pa.list_(pa.field("item", pa.utf8(), nullable=False))),
    pa.field("nullable", pa.int32(), nullable=False), pa.field("case_sensitive", pa.bool_(), nullable=False),
    pa.field("searchable", pa.int32(), nullable=False), pa.field("unsigned_attribute", pa.bool_()),
    pa.field("fixed_prec_scale", pa.bool_(), nullable=False), pa.field("auto_increment", pa.bool_()),
    pa.field("local_type_name", pa.utf8()), pa.field("minimum_scale", pa.int32()), pa.field("maximum_scale", pa.int32()),
    pa.field("sql_data_type", pa.int32(), nullable=False), pa.field("datetime_subcode", pa.int32()),
    pa.field("num_prec_radix", pa.int32()), pa.field("interval_precision", pa.int32()),
])
_NULLABLE, _SEARCHABLE_FULL, _SEARCHABLE_BASIC = 1, 3, 2
_DATETIME = 9  # XdbcDataType of every date and time type's sql_data_type; the subcode tells which
# (type name, XdbcDataType, column size, quote, numeric radix, datetime subcode): the column types DuckDB gives.
_TYPES = [
    ("VARBINARY", -3, None, None, None, None), ("BOOLEAN", -7, 1, None, None, None),
    ("TINYINT", -6, 3, None, 10, None), ("BIGINT", -5, 19, None, 10, None), ("DECIMAL", 3, 38, None, 10, None),
    ("INTEGER", 4, 10, None, 10, None), ("SMALLINT", 5, 5, None, 10, None), ("REAL", 7, 24, None, 2, None),
    ("DOUBLE", 8, 53, None, 2, None), ("VARCHAR", 12, None, "'", None, None), ("DATE", 91, 10, "'", None, 1),
    ("TIME", 92, 15, "'", None, 2), ("TIMESTAMP", 93, 26, "'", None, 3),
]


_CONSTRAINTS = """
SELECT schema_name, table_name, constraint_name, constraint_column_names, referenced_table, referenced_column_names
FROM duckdb_constraints() WHERE database_name = current_database() AND constraint_type = ?
ORDER BY schema_name, table_name, constraint_name
"""
_NO_ACTION = 3  # UpdateDeleteRules: DuckDB's foreign keys neither cascade nor set values


def keys(con: duckdb.DuckDBPyConnection, kind: str, cmd: Message) -> pa.Table:
    """GetPrimaryKeys ("primary": the key columns of cmd.table), GetImportedKeys ("imported": the foreign keys of
    cmd.table), GetExportedKeys ("exported": those that reference cmd.table) or GetCrossReference ("cross": those
    of cmd.fk_table that reference cmd.pk_table), from the database's constraints, in the spec's order."""
    with duckdb_errors():
        found = con.execute(_CONSTRAINTS, ["PRIMARY KEY" if kind == "primary" else "FOREIGN KEY"]).fetchall()
    if kind == "primary":
        rows = [{"catalog_name": CATALOG_NAME, "db_schema_name": schema, "table_name": table, "column_name": column,
                 "key_name": name, "key_sequence": i + 1}
                for schema, table, name, columns, _, _ in found if _names(cmd, "catalog", "db_schema", "table",
                                                                          schema, table)
                for i, column in enumerate(columns)]
        return pa.Table.from_pylist(rows, schema=PRIMARY_KEYS_SCHEMA)
    pk_of, fk_of = {"imported": (None, ""), "exported": ("", None), "cross": ("pk_", "fk_")}[kind]
    rows = [{"pk_catalog_name": CATALOG_NAME, "pk_db_schema_name": schema, "pk_table_name": referenced,
             "pk_column_name": pk_column, "fk_catalog_name": CATALOG_NAME, "fk_db_schema_name": schema,
             "fk_table_name": table, "fk_column_name": fk_column, "key_sequence": i + 1, "fk_key_name": name,
             "pk_key_name": None, "update_rule": _NO_ACTION, "delete_rule": _NO_ACTION}
            for schema, table, name, columns, referenced, referenced_columns in found
            if (pk_of is None or _names(cmd, f"{pk_of}catalog", f"{pk_of}db_schema", f"{pk_of}table", schema,
                                        referenced))
            and (fk_of is None or _names(cmd, f"{fk_of}catalog", f"{fk_of}db_schema", f"{fk_of}table", schema, table))
            for i, (fk_column, pk_column) in enumerate(zip(columns, referenced_columns))]
    order = ["fk_catalog_name", "fk_db_schema_name", "fk_table_name", "fk_key_name", "key_sequence"] \
        if kind == "exported" else ["pk_catalog_name", "pk_db_schema_name", "pk_table_name", "pk_key_name",
                                     "key_sequence"]
    rows.sort(key=lambda row: tuple("" if row[k] is None else row[k] for k in order))
    return pa.Table.from_pylist(rows, schema=FOREIGN_KEYS_SCHEMA)


def _names(cmd: Message, catalog: str, schema: str, table: str, schema_name: str, table_name: str) -> bool:
    """Whether a command's catalog, schema and table fields (unset ones match any) name the table."""
    return optional(cmd, catalog) in (None, CATALOG_NAME) and optional(cmd, schema) in (None, schema_name) and \
        getattr(cmd, table).lower() == table_name.lower()


def xdbc_type_info(data_type: int | None) -> pa.Table:
    """The column types a query can return, as JDBC/ODBC describe them, ordered by data type then name."""
    rows = []
    for name, code, size, quote, radix, subcode in sorted(_TYPES, key=lambda t: (t[1], t[0])):
        if data_type is not None and code != data_type:
            continue
        rows.append({"type_name": name, "data_type": code, "column_size": size, "literal_prefix": quote,
                     "literal_suffix": quote, "create_params": ["precision", "scale"] if name == "DECIMAL" else None,
                     "nullable": _NULLABLE, "case_sensitive": name == "VARCHAR",
                     "searchable": _SEARCHABLE_FULL if name == "VARCHAR" else _SEARCHABLE_BASIC,
                     "unsigned_attribute": False if radix else None, "fixed_prec_scale": False,
                     "auto_increment": False if radix else None, "local_type_name": name,
                     "minimum_scale": 0 if name == "DECIMAL" else None, "maximum_scale": 38 if name == "DECIMAL" else None,
                     "sql_data_type": _DATETIME if subcode else code, "datetime_subcode": subcode,
                     "num_prec_radix": radix, "interval_precision": None})
    return pa.Table.from_pylist(rows, schema=XDBC_TYPE_INFO_SCHEMA)


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


def db_schemas(con: duckdb.DuckDBPyConnection, catalog: str | None, schema_pattern: str | None) -> pa.Table:
    """The database's schemas matching the filters."""
    with duckdb_errors():
        names = [name for (name,) in con.sql("SELECT schema_name FROM duckdb_schemas() WHERE database_name = "
                                             "current_database() ORDER BY schema_name").fetchall()]
    pattern = like(schema_pattern)
    rows = [{"catalog_name": CATALOG_NAME, "db_schema_name": name} for name in names
            if catalog in (None, CATALOG_NAME) and pattern.fullmatch(name)]
    return pa.Table.from_pylist(rows, schema=DB_SCHEMAS_SCHEMA)


def tables(con: duckdb.DuckDBPyConnection, system: dict[str, pa.Schema], catalog: str | None,
           schema_pattern: str | None, name_pattern: str | None, table_types: list[str],
           include_schema: bool) -> pa.Table:
    """The database's tables (TABLE) and views (VIEW), and the system tables (SYSTEM TABLE, in the main schema),
    matching the filters, in the spec's order: by schema, name, then type."""
    schema = TABLES_WITH_SCHEMA_SCHEMA if include_schema else TABLES_SCHEMA
    if catalog not in (None, CATALOG_NAME):
        return schema.empty_table()
    schemas, names = like(schema_pattern), like(name_pattern)
    found = sorted(objects(con) + [(SCHEMA_NAME, name, "SYSTEM TABLE") for name in system])
    views = ai_views(con)
    rows = []
    for schema_name, name, kind in found:
        if schemas.fullmatch(schema_name) and names.fullmatch(name) and (not table_types or kind in table_types):
            row = {"catalog_name": CATALOG_NAME, "db_schema_name": schema_name, "table_name": name,
                   "table_type": kind}
            if include_schema:
                row["table_schema"] = _bounded(_listed(con, schema_name, name, kind, system, views))
            rows.append(row)
    return pa.Table.from_pylist(rows, schema=schema)


MAX_LISTED_SCHEMA_BYTES = 4 << 20  # a table's listed schema with each column's Flight SQL metadata, at most


def _bounded(schema: pa.Schema) -> bytes:
    """A listed schema's bytes; past MAX_LISTED_SCHEMA_BYTES (a table of tens of thousands of columns) without
    the columns' metadata, its names and types alone, so a client can always list it."""
    data = schema_bytes(schema)
    if len(data) <= MAX_LISTED_SCHEMA_BYTES:
        return data
    return schema_bytes(pa.schema([field.remove_metadata() for field in schema], metadata=schema.metadata))


def _listed(con: duckdb.DuckDBPyConnection, schema: str, name: str, kind: str, system: dict[str, pa.Schema],
            views: dict[str, AIView]) -> pa.Schema:
    """The schema GetTables lists for a system table, a view with AI functions (the one its query returned when it
    was created) or a table or view of the database; a view that no longer binds (a table it reads was dropped)
    is listed with no columns, so one broken view fails no one's listing."""
    try:
        return _schema_of(con, schema, name, kind, system, views)
    except QuailError as err:
        log.warning("GetTables lists %s.%s with no columns: %s", schema, name, err)
        return pa.schema([])


def _schema_of(con: duckdb.DuckDBPyConnection, schema: str, name: str, kind: str, system: dict[str, pa.Schema],
               views: dict[str, AIView]) -> pa.Schema:
    if kind == "SYSTEM TABLE":
        return listed_schema(name, result_columns(system[name]), True)
    view = views.get(name.lower()) if schema == SCHEMA_NAME else None
    if view is not None:
        return listed_schema(name, result_columns(view.schema), False)
    return listed_schema(name, _columns(con, schema, name), False, schema)


def _columns(con: duckdb.DuckDBPyConnection, schema: str, table: str) -> list[tuple[pa.Field, str]]:
    """A table's or view's columns as a query returns them (DuckDB's Arrow types), each nullable only where the
    table allows NULLs, and DuckDB's names of their SQL types."""
    arrow = statement_schema(con, f"SELECT * FROM {quoted_name(schema)}.{quoted_name(table)}")
    with duckdb_errors():
        columns = con.execute("SELECT data_type, is_nullable FROM duckdb_columns() WHERE database_name = "
                              "current_database() AND schema_name = ? AND table_name = ? ORDER BY column_index",
                              [schema, table]).fetchall()
    return [(field.with_nullable(nullable), type_name) for field, (type_name, nullable) in zip(arrow, columns)]


def listed_schema(table: str, columns: list[tuple[pa.Field, str]], read_only: bool,
                  schema_name: str = SCHEMA_NAME) -> pa.Schema:
    """A table's schema as GetTables lists it: each column as a query returns it, NOT NULL columns
    non-nullable, with Flight SQL's column metadata (catalog, schema, table, SQL type name, precision and
    scale, flags). The schema's name goes under the spec's key and under the older `SCHEMA_NAME` that drivers
    built on earlier Flight SQL libraries read."""
    fields = []
    for field, type_name in columns:
        text = is_text(field.type)
        meta = {"ARROW:FLIGHT:SQL:CATALOG_NAME": CATALOG_NAME, "ARROW:FLIGHT:SQL:DB_SCHEMA_NAME": schema_name,
                "ARROW:FLIGHT:SQL:SCHEMA_NAME": schema_name, "ARROW:FLIGHT:SQL:TABLE_NAME": table,
                "ARROW:FLIGHT:SQL:TYPE_NAME": type_name, "ARROW:FLIGHT:SQL:IS_AUTO_INCREMENT": "0",
                "ARROW:FLIGHT:SQL:IS_CASE_SENSITIVE": "1" if text else "0",
                "ARROW:FLIGHT:SQL:IS_READ_ONLY": "1" if read_only else "0", "ARROW:FLIGHT:SQL:IS_SEARCHABLE": "1"}
        if pa.types.is_decimal(field.type):
            meta |= {"ARROW:FLIGHT:SQL:PRECISION": str(field.type.precision),
                     "ARROW:FLIGHT:SQL:SCALE": str(field.type.scale)}
        fields.append(field.with_metadata(meta))
    return pa.schema(fields)


def table_types() -> pa.Table:
    return pa.table({"table_type": list(TABLE_TYPES)}, schema=TABLE_TYPES_SCHEMA)


@functools.lru_cache(maxsize=64)
def sql_info(ids: tuple[int, ...]) -> pa.Table:
    """The requested SqlInfo rows (all known ones when ids is empty); unknown ids are skipped. (Drivers ask for the
    same few lists again and again.)"""
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
