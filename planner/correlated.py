"""Correlated subqueries with AI calls: decorrelated into relations keyed by the outer columns they read.

`EXISTS (SELECT ... FROM t WHERE AI_FILTER(PROMPT('{0} {1}', r.body, t.x)))`
reads the outer row only through `r.body`. The subquery becomes an
uncorrelated SELECT over its own FROM crossed with the distinct values of
those outer columns, returning the values for which it has rows (for `IN`:
with the value it returns); each value set is asked of the model once,
whatever the outer query's size. The predicate becomes a correlated
`EXISTS` over that relation, matching NULLs as equal (`IS NOT DISTINCT FROM`),
which DuckDB (or the outer AI core) evaluates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sqlglot import exp

from quail.engine.errors import InvalidArgument

from quail.planner.ai_calls import ancestors
from quail.planner.dialects import position
from quail.planner.subqueries import sources

KEY = "__quail_key"
IN_VALUE = "__quail_in"
MATCH = "__quail_s"


def outer_columns(select: exp.Select) -> list[exp.Column]:
    """Columns of this SELECT (not of deeper ones) qualified by an alias its FROM does not define."""
    defined = {s.alias_or_name.lower() for s in sources(select)}
    return [c for c in select.find_all(exp.Column)
            if c.table and c.table.lower() not in defined
            and next(a for a in ancestors(c) if isinstance(a, exp.Select)) is select]


@dataclass
class Decorrelated:
    """The predicate that held a correlated subquery, and how to rewrite it once the subquery is a relation."""

    predicate: exp.Expression
    reader: Callable[[str], exp.Expression]


def decorrelate(select: exp.Select, has_table: Callable[[str], bool]) -> Decorrelated | None:
    """Make a correlated subquery with AI calls uncorrelated, in place (None: it was not correlated)."""
    outer = outer_columns(select)
    if not outer:
        return None
    predicate, probe = _predicate(select)
    _check_shape(select, predicate)
    keys: dict[tuple[str, str], str] = {}
    for column in outer:
        keys.setdefault((column.table.lower(), column.name.lower()), f"{KEY}_{len(keys)}")
    for alias in dict.fromkeys(table for table, _ in keys):
        table = _outer_table(predicate, alias, has_table)
        values = exp.select(*(exp.column(name) for (a, name) in keys if a == alias)).distinct().from_(table.copy())
        select.join(exp.Subquery(this=values, alias=exp.TableAlias(this=exp.to_identifier(alias))),
                    join_type="CROSS", copy=False)
    projection = [exp.alias_(exp.column(name, table), key, quoted=True) for (table, name), key in keys.items()]
    if probe is not None:
        projection.insert(0, exp.alias_(select.expressions[0].copy(), IN_VALUE, quoted=True))
    select.set("expressions", projection)
    select.set("distinct", exp.Distinct())
    select.set("order", None)
    select.set("limit", None)

    def reader(name: str) -> exp.Expression:
        match = [exp.NullSafeEQ(this=exp.column(key, MATCH, quoted=True), expression=exp.column(column, table))
                 for (table, column), key in keys.items()]
        if probe is not None:
            match.insert(0, exp.EQ(this=exp.column(IN_VALUE, MATCH, quoted=True), expression=probe.copy()))
        found = exp.select("1").from_(exp.Table(this=exp.to_identifier(name, quoted=True),
                                                alias=exp.TableAlias(this=exp.to_identifier(MATCH))))
        return exp.Exists(this=found.where(exp.and_(*match)))

    return Decorrelated(predicate, reader)


def _predicate(select: exp.Select) -> tuple[exp.Expression, exp.Expression | None]:
    """The EXISTS or IN holding the subquery, and IN's probed value (None for EXISTS)."""
    parent = select.parent
    if isinstance(parent, exp.Exists):
        return parent, None
    if isinstance(parent, exp.Subquery) and isinstance(parent.parent, exp.In) and parent.arg_key == "query":
        holder = parent.parent
        if isinstance(holder.parent, exp.Not):
            raise InvalidArgument(f"NOT IN over a correlated subquery with AI functions is not supported yet "
                                  f"(write NOT EXISTS){position(holder)}")
        return holder, holder.this
    if isinstance(parent, (exp.All, exp.Any)):  # snowflake reads `x NOT IN (...)` as `x <> ALL (...)`
        raise InvalidArgument(f"NOT IN, ALL or ANY over a correlated subquery with AI functions is not supported yet "
                              f"(write NOT EXISTS){position(parent)}")
    raise InvalidArgument(f"a correlated subquery with AI functions is supported in EXISTS and IN only"
                          f"{position(select)}")


def _check_shape(select: exp.Select, predicate: exp.Expression) -> None:
    """Grouping, aggregates, windows and DISTINCT change what decorrelation would return: refused."""
    if any(select.args.get(k) for k in ("group", "having", "qualify", "distinct")) or any(
            isinstance(n, (exp.AggFunc, exp.Window)) for item in select.expressions for n in item.walk()):
        raise InvalidArgument(f"a correlated subquery with AI functions and grouping, aggregates, windows or "
                              f"DISTINCT is not supported yet{position(select)}")
    limit = select.args.get("limit")
    if limit is not None and not (isinstance(predicate, exp.Exists) and isinstance(limit.expression, exp.Literal)
                                  and not limit.expression.is_string and int(limit.expression.this) >= 1):
        raise InvalidArgument(f"LIMIT in a correlated subquery with AI functions is supported in EXISTS only"
                              f"{position(limit)}")
    if isinstance(predicate, exp.In) and len(select.expressions) != 1:
        raise InvalidArgument(f"an IN subquery returns one column{position(select)}")


def _outer_table(predicate: exp.Expression, alias: str, has_table: Callable[[str], bool]) -> exp.Table:
    """The stored table the outer query names `alias`, from the nearest enclosing SELECT that defines it."""
    for owner in ancestors(predicate):
        if not isinstance(owner, exp.Select):
            continue
        for source in sources(owner):
            if source.alias_or_name.lower() != alias:
                continue
            if isinstance(source, exp.Table) and has_table(source.name):
                table = source.copy()
                table.set("alias", None)
                return table
            raise InvalidArgument(f"a correlated subquery with AI functions may read the outer query's stored "
                                  f"tables only, not {source.sql()}{position(source)}")
    raise InvalidArgument(f"unknown table or alias {alias!r} in a subquery")
