"""What the planner and executor need of stored tables, and an in-memory catalog.

- A catalog names tables (case-insensitively), gives their schemas and the
  statistics planning reads (row counts, a column's values), and the DuckDB
  connection a plan's statements run on.
- `relations(names)` are the Arrow tables a statement over those tables must
  register on that connection: all of them for tables held in memory, none
  for the tables the database itself holds (database.py); `relation_names()`
  names every table that is such a relation.
- `version` changes whenever a table may have changed: a plan made at one
  version holds until the next.
- `ai_views()` are the views whose definitions call AI functions, which
  Quail keeps and expands into the statements that read them
  (planner/views.py), by lower-case name.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, closing
from dataclasses import dataclass
from typing import Iterable, Protocol

import duckdb
import pyarrow as pa

from quail.engine.errors import AlreadyExists, InvalidArgument, NotFound
from quail.engine.exec.relational import memory_database


RESERVED = "__quail"  # the prefix of the relations and columns a plan makes: no stored name may take it


def check_names(name: str, columns: list[str]) -> None:
    """InvalidArgument when a table's name or one of its columns' takes the reserved prefix."""
    taken = [n for n in [name, *columns] if n.lower().startswith(RESERVED)]
    if taken:
        raise InvalidArgument(f"the name {taken[0]!r} is reserved: names starting with {RESERVED} are Quail's own")


@dataclass(frozen=True)
class AIView:
    """A view whose definition calls AI functions: its name, its query's text in `dialect`, its result schema."""

    name: str
    sql: str
    dialect: str
    schema: pa.Schema


class Catalog(Protocol):
    """Named tables, looked up case-insensitively, and where statements over them run."""

    @property
    def version(self) -> int: ...

    def names(self) -> list[str]: ...

    def has(self, name: str) -> bool: ...

    def schema(self, name: str) -> pa.Schema: ...

    def rows(self, name: str) -> int: ...

    def column(self, name: str, column: str) -> pa.ChunkedArray | None: ...

    def relations(self, names: Iterable[str]) -> dict[str, pa.Table]: ...

    def relation_names(self) -> list[str]: ...

    def ai_views(self) -> dict[str, AIView]: ...

    def connection(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]: ...


def column_of(table: pa.Table, column: str) -> pa.ChunkedArray | None:
    """A table's column by name, whatever the case (None: no such column)."""
    match = [c for c in table.column_names if c.lower() == column.lower()]
    return table.column(match[0]) if match else None


class MemoryCatalog:
    """Tables registered in memory: the in-process Python API's catalog.

    Tables registered in memory (the in-process Python API's catalog); statements run on a connection of
    their own to the process's in-memory DuckDB, each table registered there."""

    def __init__(self) -> None:
        self._tables: dict[str, tuple[str, pa.Table]] = {}
        self.version = 0

    def register(self, name: str, table: pa.Table, replace: bool = False) -> None:
        if not name:
            raise InvalidArgument("a table needs a name")
        check_names(name, table.schema.names)
        if name.lower() in self._tables and not replace:
            raise AlreadyExists(f"table {name!r} already exists")
        self._tables[name.lower()] = (name, table)
        self.version += 1

    def names(self) -> list[str]:
        return sorted(name for name, _ in self._tables.values())

    def has(self, name: str) -> bool:
        return name.lower() in self._tables

    def schema(self, name: str) -> pa.Schema:
        return self.table(name).schema

    def rows(self, name: str) -> int:
        return self.table(name).num_rows

    def column(self, name: str, column: str) -> pa.ChunkedArray | None:
        return column_of(self.table(name), column)

    def relations(self, names: Iterable[str]) -> dict[str, pa.Table]:
        return {name: self.table(name) for name in names}

    def relation_names(self) -> list[str]:
        return self.names()

    def ai_views(self) -> dict[str, AIView]:
        return {}

    def connection(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        return closing(memory_database().cursor())

    def table(self, name: str) -> pa.Table:
        entry = self._tables.get(name.lower())
        if entry is None:
            raise NotFound(f"table {name!r} does not exist")
        return entry[1]
