"""Binding a syntax tree to the catalog (table names) and to parameter values."""

from __future__ import annotations

from typing import Any, Sequence

from sqlglot import exp

from quail.engine.catalog import Catalog
from quail.engine.errors import InvalidArgument, NotFound

from .dialects import position

CATALOG_NAME = "quail"
SCHEMA_NAME = "main"


def bind_tables(tree: exp.Expression, catalog: Catalog) -> tuple[str, ...]:
    """Check every table the statement reads exists; strip `quail.main.` qualifiers in place.

    Returns the stored tables read, lower-cased, in first-use order. Names of
    CTEs are not tables.
    """
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    tables: list[str] = []
    for table in tree.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            raise InvalidArgument(f"table functions are not supported{position(table)}")
        name = table.name
        catalog_name, schema_name = table.catalog, table.db
        if not catalog_name and not schema_name and name.lower() in ctes:
            continue
        if (catalog_name and catalog_name.lower() != CATALOG_NAME) or (schema_name and schema_name.lower() != SCHEMA_NAME):
            raise NotFound(f"schema {'.'.join(p for p in (catalog_name, schema_name) if p)!r} does not exist{position(table)}")
        if not catalog.has(name):
            raise NotFound(f"table {name!r} does not exist{position(table)}")
        table.set("catalog", None)
        table.set("db", None)
        if name.lower() not in tables:
            tables.append(name.lower())
    return tuple(tables)


def bind_parameters(tree: exp.Expression, values: Sequence[Any] | None) -> int:
    """Replace `?` placeholders, in order, by literals of the values (NULL when values is None).

    Returns how many placeholders the statement had.
    """
    holders = list(tree.find_all(exp.Placeholder))
    holders.sort(key=lambda p: (p.meta.get("line", 0), p.meta.get("col", 0)))
    if values is not None and len(values) != len(holders):
        raise InvalidArgument(f"the statement has {len(holders)} parameter(s), {len(values)} value(s) were bound")
    for i, holder in enumerate(holders):
        holder.replace(exp.null() if values is None else exp.convert(values[i]))
    return len(holders)
