"""The data directory's DuckDB database: the storage of record of a Quail server.

- One file, `quail.duckdb`, in the data directory: tables, views, schemas,
  sequences, constraints, the WAL and checkpoints are DuckDB's, and so are
  transactions. DuckDB locks the file, so a second server over the same data
  directory refuses to start.
- Opened with no external access (files, network, extensions) and its
  configuration locked: no statement reaches outside the database file, or
  changes a setting for everyone. `memory_limit` bounds DuckDB's buffer
  manager; bigger work spills to a temporary folder beside the file.
- `version` counts the commits made through this process: a plan made at one
  version holds until the next.
- A data directory written by the earlier store is imported on first open
  (legacy_store.py).
"""

from __future__ import annotations

import logging
import threading
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Iterable

import duckdb
import pyarrow as pa
import pyarrow.ipc  # noqa: F401 - pa.ipc

from quail.engine.errors import Unavailable
from quail.engine.exec import embedding_functions, legacy_store
from quail.engine.exec.catalog import RESERVED, AIView, column_of
from quail.engine.exec.relational import CONFIG, duckdb_errors, quoted_name, statement_schema
from quail.engine.runtime.embeddings import Embeddings

FILE = "quail.duckdb"
VIEWS = "main.__quail_views"  # the views whose definitions call AI functions (planner/views.py)
log = logging.getLogger("quail.database")

_OBJECTS = f"""
SELECT table_name AS name, 'TABLE' AS kind, schema_name, database_name FROM duckdb_tables()
WHERE NOT starts_with(lower(table_name), '{RESERVED}')
UNION ALL SELECT view_name, 'VIEW', schema_name, database_name FROM duckdb_views() WHERE NOT internal
UNION ALL SELECT name, 'VIEW', 'main', current_database() FROM {VIEWS}
"""


class Database:
    """A data directory's DuckDB database file, open for this process alone; connections for statements."""

    def __init__(self, data_dir: str | Path, memory_limit: str | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.data_dir / FILE
        config = {**CONFIG, "lock_configuration": True, **({"memory_limit": memory_limit} if memory_limit else {})}
        try:
            self._db = duckdb.connect(str(self.path), config=config)
        except duckdb.IOException as err:
            raise Unavailable(f"the data directory {self.data_dir} is in use by another Quail server, or its "
                              f"database cannot be opened: {err}") from None
        except duckdb.Error as err:
            raise Unavailable(f"cannot open the database {self.path}: {err}") from None
        self._lock = threading.Lock()
        self._version = 0
        self._views: tuple[int, dict[str, AIView]] | None = None
        with self.cursor() as con, duckdb_errors():
            con.execute(f"CREATE TABLE IF NOT EXISTS {VIEWS} (key VARCHAR PRIMARY KEY, name VARCHAR NOT NULL, "
                        "sql VARCHAR NOT NULL, dialect VARCHAR NOT NULL, schema BLOB NOT NULL)")
        try:
            with self.cursor() as con:
                legacy_store.upgrade(self.data_dir, con)
        except (OSError, ValueError, pa.ArrowException, duckdb.Error) as err:
            self._db.close()
            raise Unavailable(f"cannot import the earlier store in {self.data_dir}: {err}; nothing was imported, "
                              f"and its files are as they were") from None

    @property
    def version(self) -> int:
        return self._version

    def changed(self) -> None:
        """Say that a commit may have changed tables (plans made before no longer hold)."""
        with self._lock:
            self._version += 1

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new connection to the database, with a transaction context of its own."""
        return self._db.cursor()

    def serve_embeddings(self, embeddings: Embeddings) -> None:
        """Let every connection's statements embed texts with `embeddings` (AI_EMBED, AI_SIMILARITY)."""
        embedding_functions.register(self._db, embeddings)

    def ai_views(self) -> dict[str, AIView]:
        """The committed views with AI functions, read once per version."""
        known = self._views
        if known is not None and known[0] == self._version:
            return known[1]
        version = self._version
        with self.cursor() as con:
            views = ai_views(con)
        self._views = (version, views)
        return views

    def close(self) -> None:
        """Checkpoint and release the file (another server may open it afterwards)."""
        self._db.close()


class DatabaseCatalog:
    """The tables and views a connection to the database sees.

    (main schema, and its own temporary ones), as the
    planner and executor ask for them: statements run on that connection and read the tables there (no Arrow
    relations to register). The names are read once, when first asked."""

    def __init__(self, database: Database, con: duckdb.DuckDBPyConnection, committed: bool = True) -> None:
        self.database = database
        self.con = con
        self.committed = committed  # the connection sees only what is committed (it is in no transaction)
        self._names: dict[str, str] | None = None
        self._views: dict[str, AIView] | None = None

    @property
    def version(self) -> int:
        return self.database.version

    def _listed(self) -> dict[str, str]:
        if self._names is None:
            with duckdb_errors():
                rows = self.con.sql(f"SELECT name FROM ({_OBJECTS}) WHERE schema_name = 'main' AND "
                                    "database_name IN (current_database(), 'temp') ORDER BY name").fetchall()
            self._names = {name.lower(): name for (name,) in rows}
        return self._names

    def names(self) -> list[str]:
        return sorted(self._listed().values())

    def has(self, name: str) -> bool:
        return name.lower() in self._listed()

    def schema(self, name: str) -> pa.Schema:
        return statement_schema(self.con, f"SELECT * FROM {quoted_name(name)}")

    def rows(self, name: str) -> int:
        with duckdb_errors():
            return self.con.sql(f"SELECT count(*) FROM {quoted_name(name)}").fetchall()[0][0]

    def column(self, name: str, column: str) -> pa.ChunkedArray | None:
        if column_of(self.schema(name).empty_table(), column) is None:
            return None
        with duckdb_errors():
            return self.con.sql(f"SELECT {quoted_name(column)} FROM {quoted_name(name)}").to_arrow_table().column(0)

    def relations(self, names: Iterable[str]) -> dict[str, pa.Table]:
        return {}

    def relation_names(self) -> list[str]:
        return []

    def ai_views(self) -> dict[str, AIView]:
        """The views with AI functions the connection sees (the database's, shared, outside a transaction)."""
        if self.committed:
            return self.database.ai_views()
        if self._views is None:
            self._views = ai_views(self.con)
        return self._views

    def connection(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        return nullcontext(self.con)


def ai_views(con: duckdb.DuckDBPyConnection) -> dict[str, AIView]:
    """The views with AI functions a connection sees, by lower-case name."""
    with duckdb_errors():
        rows = con.execute(f"SELECT key, name, sql, dialect, schema FROM {VIEWS}").fetchall()
    return {key: AIView(name, sql, dialect, pa.ipc.read_schema(pa.py_buffer(schema)))
            for key, name, sql, dialect, schema in rows}


def objects(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str, str]]:
    """Every table and view of the database's schemas (not its temporary ones): (schema, name, TABLE or VIEW),
    sorted."""
    with duckdb_errors():
        return con.sql(f"SELECT schema_name, name, kind FROM ({_OBJECTS}) WHERE database_name = current_database() "
                       "ORDER BY schema_name, name").fetchall()
