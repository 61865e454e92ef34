"""Quail over Flight SQL: an ADBC connection to a server, and a Session's calls made there.

`connect` gives the connection; a RemoteSession makes a Session's calls on the server.

    import quail
    with quail.RemoteSession("grpc://localhost:31337") as session:
        session.register("reviews", table)
        rows = session.sql("SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} kind?', body))").collect()

The server plans and runs every query (its model, its data directory) and
keeps each query's report in the session, where `run()` reads it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import pyarrow as pa

from quail.planner.dialects import DEFAULT_DIALECT

from quail.results import DocumentProvider, Report, Result

CLIENT_OPTION = "adbc.flight.sql.client_option."
TLS_OPTIONS = ("tls_root_certs", "tls_skip_verify", "tls_override_hostname")
SESSION_OPTION = "adbc.flight.sql.session.option."
SESSION_OPTIONS = "adbc.flight.sql.session.options"
LAST_QUERY = "quail.last_query"
OPEN = "quail.session"  # the server reports it "open" to a call that came with its session's cookie
SESSION_TRIES = 5


def connect(uri: str, dialect: str | None = None, **db_kwargs: str):
    """An ADBC DB-API connection to a Quail server (autocommit; session cookies on, so options stick).

    dialect: the session's SQL dialect (the server's default when None); db_kwargs:
    further ADBC Flight SQL database options (e.g. `username`, `password`).
    """
    import adbc_driver_flightsql.dbapi as flight_sql

    options = {"adbc.flight.sql.rpc.with_cookie_middleware": "true", **db_kwargs}
    connection = flight_sql.connect(uri, db_kwargs=options, autocommit=True)
    if dialect is not None:
        set_session_options(connection, dialect=dialect)
    return connection


def tls_options(root_certs: str | None = None, skip_verify: bool = False,
                override_hostname: str | None = None) -> dict[str, str]:
    """The ADBC Flight SQL driver's TLS options: trust what the PEM file `root_certs` signs (a path), verify
    nothing, or expect this host name in the server's certificate."""
    options = {"tls_root_certs": Path(root_certs).read_text() if root_certs else None,
               "tls_skip_verify": "true" if skip_verify else None, "tls_override_hostname": override_hostname}
    return {CLIENT_OPTION + name: value for name, value in options.items() if value is not None}


def listed_tables(connection, schema: str | None = None, name: str | None = None,
                  types: Sequence[str] | None = None) -> list[dict[str, str]]:
    """The tables and views ADBC's `adbc_get_objects` lists, each's schema, name and type; only those of this
    schema, of this name (each matched exactly: LIKE's wildcards escaped) and of these types, where given."""
    objects = connection.adbc_get_objects(depth="tables", db_schema_filter=_exactly(schema),
                                          table_name_filter=_exactly(name),
                                          table_types_filter=list(types) if types is not None else None)
    return [{"schema": found["db_schema_name"], "name": table["table_name"], "type": table["table_type"]}
            for catalog in objects.read_all().to_pylist() for found in catalog["catalog_db_schemas"] or []
            for table in found["db_schema_tables"] or []
            if schema in (None, found["db_schema_name"]) and name in (None, table["table_name"])]


def _exactly(name: str | None) -> str | None:
    """A name as a Flight SQL LIKE pattern matching only itself."""
    return None if name is None else re.sub(r"([\\%_])", r"\\\1", name)


def error_reason(err: Exception) -> str:
    """A driver's or Arrow's error as one line: its first, without the driver's own detail (a traceback)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0].split(" Detail: ")[0]


def set_session_options(connection, **options: str) -> None:
    """Set Flight session options on an ADBC connection to a Quail server, and read them back until they hold.

    - The ADBC Flight SQL driver (arrow-go's cookie middleware) can drop the cookie that opens a session:
      a DoAction's end races a goroutine of the middleware, and on a busy host the goroutine may win,
      discarding the answer's headers. The client then has no session, and its later calls run under the
      server's defaults: in another dialect, silently.
    - Reading the options back (with the server's read-only `quail.session`) finds that; setting them again
      opens a new session, whose cookie is kept. ConnectionError after SESSION_TRIES tries.
    """
    wanted = {name: str(value) for name, value in options.items()}
    for _ in range(SESSION_TRIES):
        connection.adbc_connection.set_options(**{SESSION_OPTION + name: value for name, value in wanted.items()})
        held = json.loads(connection.adbc_connection.get_option(SESSION_OPTIONS))
        if held.get(OPEN) == "open" and all(held.get(name) == value for name, value in wanted.items()):
            return
    raise ConnectionError(f"the server did not keep the session options {sorted(wanted)}: its session cookie "
                          f"did not come back in {SESSION_TRIES} tries")


@dataclass
class RemoteQuery:
    """A query to run on the server: the same calls as a local `Query`."""

    session: "RemoteSession"
    text: str
    dialect: str
    params: list[Any] | None = None

    def explain(self) -> str:
        """The server's plan, a line per step (`EXPLAIN <query>`)."""
        table = self.session._fetch("EXPLAIN " + self.text, self.dialect, self.params)
        return "\n".join(table.column(0).to_pylist())

    def run(self) -> Result:
        """Rows, and the server's report of the query (its session option `quail.last_query`)."""
        table = self.session._fetch(self.text, self.dialect, self.params)
        options = json.loads(self.session.connection.adbc_connection.get_option(SESSION_OPTIONS))
        return Result(table, Report(**json.loads(options[LAST_QUERY])))

    def collect(self) -> pa.Table:
        return self.run().collect()

    def execute_stream(self) -> Iterator[pa.RecordBatch]:
        """Record batches as the server sends them."""
        with self.session._cursor(self.dialect) as cursor:
            cursor.execute(self.text, self.params)
            yield from cursor.fetch_record_batch()


class RemoteSession:
    """A Session whose tables live on a Quail server and whose queries run there."""

    def __init__(self, endpoint: str, **db_kwargs: str) -> None:
        self.endpoint = endpoint
        self.connection = connect(endpoint, **db_kwargs)
        self._dialect: str | None = None

    def __enter__(self) -> "RemoteSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.connection.close()

    def register(self, name: str, source: DocumentProvider | pa.Table, replace: bool = False) -> None:
        """Store a table on the server (replacing one of that name only when asked)."""
        table = source.table if isinstance(source, DocumentProvider) else source
        with self.connection.cursor() as cursor:
            cursor.adbc_ingest(name, table, mode="replace" if replace else "create")

    def sql(self, text: str, dialect: str = DEFAULT_DIALECT, params: list[Any] | None = None) -> RemoteQuery:
        return RemoteQuery(self, text, dialect, params)

    def _cursor(self, dialect: str):
        if dialect != self._dialect:
            set_session_options(self.connection, dialect=dialect)
            self._dialect = dialect
        return self.connection.cursor()

    def _fetch(self, text: str, dialect: str, params: list[Any] | None) -> pa.Table:
        with self._cursor(dialect) as cursor:
            cursor.execute(text, params)
            return cursor.fetch_arrow_table()
