"""A SQLAlchemy 2 dialect for Quail over the ADBC Flight SQL driver: `create_engine("quail://host:port")`.

- URLs: `quail://[user:password@]host[:port]` (plain gRPC), `quail+tls://...` (TLS); query options
  `tls_skip_verify=true`, `tls_root_certs=/path/ca.pem`, `tls_override_hostname=name`.
- Each connection is `quail.remote.connect(..., dialect="duckdb")`: SQLAlchemy's SQL (PostgreSQL's compiler,
  DuckDB's types) runs as DuckDB's, with AI functions anywhere, parameters bound (qmark) by the server.
- Transactions are SQL `BEGIN` / `COMMIT` / `ROLLBACK` in the connection's server session; isolation level
  `AUTOCOMMIT` leaves them out (a statement commits as it ends), saving two round trips a transaction.
- Reflection is `quail.sqlalchemy_reflection`'s.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import exc
from sqlalchemy import types as sqltypes
from sqlalchemy.dialects.postgresql import INTERVAL
from sqlalchemy.dialects.postgresql.base import PGCompiler, PGIdentifierPreparer, PGTypeCompiler
from sqlalchemy.engine import URL, default, reflection
from sqlalchemy.sql import compiler

from quail import remote
from quail import sqlalchemy_reflection as reflect

DEFAULT_PORT = 8815
ISOLATION_LEVELS = ("SERIALIZABLE", "AUTOCOMMIT")  # DuckDB's snapshot isolation, or none


class QuailConnection:
    """A DB-API connection: ADBC's, its transactions SQL's in its server session.

    - ADBC's own connection is in autocommit mode; its server session keeps a `BEGIN` until `COMMIT` or `ROLLBACK`.
    """

    def __init__(self, adbc) -> None:
        self.adbc = adbc
        self.autocommit = False
        self.in_transaction = False

    def cursor(self):
        return self.adbc.cursor()

    def begin(self) -> None:
        if not self.autocommit:
            self._run("BEGIN TRANSACTION")
            self.in_transaction = True

    def commit(self) -> None:
        self._end("COMMIT")

    def rollback(self) -> None:
        self._end("ROLLBACK")

    def close(self) -> None:
        self.adbc.close()

    def _end(self, statement: str) -> None:
        if self.in_transaction:
            self.in_transaction = False
            self._run(statement)

    def _run(self, statement: str) -> None:
        with self.adbc.cursor() as cursor:
            cursor.execute(statement)


class QuailInterval(INTERVAL):
    """An interval read as a timedelta: a month as 30 days, as PostgreSQL's drivers read it.

    - Arrow gives months, days and nanoseconds.
    """

    def result_processor(self, dialect, coltype):
        def process(value):
            if value is None:
                return None
            return timedelta(days=30 * value.months + value.days, microseconds=value.nanoseconds // 1000)
        return process

    @classmethod
    def adapt_emulated_to_native(cls, interval, **kw: Any) -> "QuailInterval":
        return cls(precision=interval.second_precision)


class QuailBinary(sqltypes.LargeBinary):
    """Bytes bound as they are: ADBC binds them as Arrow binary (its DB-API has no `Binary`)."""

    def bind_processor(self, dialect):
        return None


class QuailTypeCompiler(PGTypeCompiler):
    """PostgreSQL's type names, which DuckDB reads, but a float's size is DuckDB's: FLOAT is 4 bytes there."""

    def visit_FLOAT(self, type_: sqltypes.Float, **kw: Any) -> str:
        return "REAL" if type_.precision is not None and type_.precision <= 24 else "DOUBLE"


class QuailDialect(default.DefaultDialect):
    """Quail over plain gRPC (`quail://`)."""

    name = "quail"
    driver = "adbc"
    scheme = "grpc"
    supports_statement_cache = True
    default_paramstyle = "qmark"
    statement_compiler = PGCompiler
    ddl_compiler = compiler.DDLCompiler
    type_compiler_cls = QuailTypeCompiler
    preparer = PGIdentifierPreparer
    colspecs = {sqltypes.Interval: QuailInterval, sqltypes.LargeBinary: QuailBinary}
    supports_native_boolean = True
    supports_native_decimal = True
    supports_native_enum = False
    supports_smallserial = False
    supports_identity_columns = False
    supports_sequences = True
    sequences_optional = True
    supports_default_values = True
    supports_default_metavalue = True
    supports_empty_insert = False
    supports_multivalues_insert = True
    supports_sane_rowcount = True
    supports_sane_multi_rowcount = True
    insert_returning = update_returning = delete_returning = True
    max_identifier_length = 255
    _backslash_escapes = False  # PostgreSQL's compiler asks: DuckDB's strings take a backslash as it is
    _supports_jsonb_subscripting = False
    _json_serializer = _json_deserializer = None

    @classmethod
    def import_dbapi(cls):
        import adbc_driver_flightsql.dbapi

        return adbc_driver_flightsql.dbapi

    def create_connect_args(self, url: URL) -> tuple[list, dict[str, str]]:
        """The server's gRPC URI, and the ADBC options: login, TLS."""
        options = {name: str(value) for name, value in (("username", url.username), ("password", url.password))
                   if value is not None}
        unknown = set(url.query) - set(remote.TLS_OPTIONS)
        if unknown:
            raise exc.ArgumentError(f"unknown quail URL option {sorted(unknown)[0]!r}: known are "
                                    f"{', '.join(remote.TLS_OPTIONS)}")
        options.update(remote.tls_options(url.query.get("tls_root_certs"), url.query.get("tls_skip_verify") == "true",
                                          url.query.get("tls_override_hostname")))
        return [f"{self.scheme}://{url.host or 'localhost'}:{url.port or DEFAULT_PORT}"], options

    def connect(self, *cargs: str, **cparams: str) -> QuailConnection:
        return QuailConnection(remote.connect(*cargs, dialect="duckdb", **cparams))

    def get_driver_connection(self, connection: QuailConnection):
        return connection.adbc

    def do_begin(self, dbapi_connection: QuailConnection) -> None:
        dbapi_connection.begin()

    def do_execute(self, cursor, statement: str, parameters, context=None) -> None:
        """A statement that changes rows, returning none, runs as ADBC's update (its count of rows is rowcount);
        any other as a query."""
        if context is not None and context.is_crud and not context.compiled.effective_returning:
            cursor.executemany(statement, [parameters] if parameters else None)
        else:
            cursor.execute(statement, parameters)

    def get_isolation_level_values(self, dbapi_connection: QuailConnection) -> list[str]:
        return list(ISOLATION_LEVELS)

    def get_isolation_level(self, dbapi_connection: QuailConnection) -> str:
        return ISOLATION_LEVELS[dbapi_connection.autocommit]

    def set_isolation_level(self, dbapi_connection: QuailConnection, level: str) -> None:
        dbapi_connection.autocommit = level == "AUTOCOMMIT"

    def _get_default_schema_name(self, connection) -> str:
        return connection.exec_driver_sql("SELECT current_schema()").scalar()

    def has_table(self, connection, table_name: str, schema: str | None = None, **kw: Any) -> bool:
        return bool(reflect.table_names(_adbc(connection), self._schema(schema), reflect.TABLE_TYPES
                                        + reflect.VIEW_TYPES, table_name))

    @reflection.cache
    def get_schema_names(self, connection, **kw: Any) -> list[str]:
        return reflect.schema_names(_adbc(connection))

    @reflection.cache
    def get_table_names(self, connection, schema: str | None = None, **kw: Any) -> list[str]:
        return reflect.table_names(_adbc(connection), self._schema(schema), reflect.TABLE_TYPES)

    @reflection.cache
    def get_view_names(self, connection, schema: str | None = None, **kw: Any) -> list[str]:
        return reflect.table_names(_adbc(connection), self._schema(schema), reflect.VIEW_TYPES)

    @reflection.cache
    def get_columns(self, connection, table_name: str, schema: str | None = None, **kw: Any) -> list[dict]:
        return reflect.columns(_adbc(connection), self._schema(schema), table_name)

    @reflection.cache
    def get_pk_constraint(self, connection, table_name: str, schema: str | None = None, **kw: Any) -> dict:
        return reflect.primary_key(_adbc(connection), self._schema(schema), table_name)

    @reflection.cache
    def get_foreign_keys(self, connection, table_name: str, schema: str | None = None, **kw: Any) -> list[dict]:
        return reflect.foreign_keys(_adbc(connection), self._schema(schema), table_name)

    @reflection.cache
    def get_unique_constraints(self, connection, table_name: str, schema: str | None = None,
                               **kw: Any) -> list[dict]:
        return reflect.unique_constraints(_adbc(connection), self._schema(schema), table_name)

    def get_indexes(self, connection, table_name: str, schema: str | None = None, **kw: Any) -> list[dict]:
        """None reflected: DuckDB's indexes (ART) are not listed by Flight SQL, and its keys are constraints."""
        return []

    def _schema(self, schema: str | None) -> str:
        return schema or self.default_schema_name


class QuailTLSDialect(QuailDialect):
    """Quail over TLS (`quail+tls://`)."""

    scheme = "grpc+tls"
    supports_statement_cache = True


def _adbc(connection):
    """The ADBC DB-API connection under a SQLAlchemy connection."""
    return connection.connection.driver_connection
