"""What the planner and executor need of stored tables, and an in-memory catalog."""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from quail.engine.errors import AlreadyExists, InvalidArgument, NotFound


RESERVED = "__quail"  # the prefix of the relations and columns a plan makes: no stored name may take it


def check_names(name: str, columns: list[str]) -> None:
    """InvalidArgument when a table's name or one of its columns' takes the reserved prefix."""
    taken = [n for n in [name, *columns] if n.lower().startswith(RESERVED)]
    if taken:
        raise InvalidArgument(f"the name {taken[0]!r} is reserved: names starting with {RESERVED} are Quail's own")


class Catalog(Protocol):
    """Named Arrow tables, looked up case-insensitively."""

    def names(self) -> list[str]: ...

    def has(self, name: str) -> bool: ...

    def schema(self, name: str) -> pa.Schema: ...

    def table(self, name: str) -> pa.Table: ...


class MemoryCatalog:
    """Tables registered in memory (the in-process Python API's catalog)."""

    def __init__(self) -> None:
        self._tables: dict[str, tuple[str, pa.Table]] = {}

    def register(self, name: str, table: pa.Table, replace: bool = False) -> None:
        if not name:
            raise InvalidArgument("a table needs a name")
        check_names(name, table.schema.names)
        if name.lower() in self._tables and not replace:
            raise AlreadyExists(f"table {name!r} already exists")
        self._tables[name.lower()] = (name, table)

    def names(self) -> list[str]:
        return sorted(name for name, _ in self._tables.values())

    def has(self, name: str) -> bool:
        return name.lower() in self._tables

    def schema(self, name: str) -> pa.Schema:
        return self.table(name).schema

    def table(self, name: str) -> pa.Table:
        entry = self._tables.get(name.lower())
        if entry is None:
            raise NotFound(f"table {name!r} does not exist")
        return entry[1]
