"""Which statements only pick columns of one relation, so the executor may take them in Arrow (plan.Picks)."""

from __future__ import annotations

from sqlglot import exp

from quail.engine.exec.plan import Picks

_PICKS_ONLY = ("expressions", "from_")  # a SELECT's parts that picking columns may have


def column_picks(select: exp.Expression) -> Picks | None:
    """What a `SELECT` of plain columns, each perhaps aliased, from one table does (nothing else: no WHERE,
    join, grouping, order, limit, DISTINCT or star); None for any other statement.

    >>> from sqlglot import parse_one
    >>> column_picks(parse_one('SELECT r.id, body AS b FROM "__quail_ai_2" AS r'))
    Picks(source='__quail_ai_2', columns=(('id', None), ('body', 'b')))
    >>> column_picks(parse_one('SELECT id FROM t WHERE id > 1')) is None
    True
    >>> column_picks(parse_one('SELECT id + 1 AS id FROM t')) is None
    True
    >>> column_picks(parse_one('SELECT t.id FROM t AS r')) is None
    True
    """
    if not isinstance(select, exp.Select) or any(v for k, v in select.args.items() if k not in _PICKS_ONLY):
        return None
    table = select.args["from_"].this if select.args.get("from_") else None
    if not isinstance(table, exp.Table) or table.db or table.catalog or not isinstance(table.this, exp.Identifier):
        return None
    name = table.alias_or_name.lower()  # DuckDB knows an aliased table by its alias alone
    columns = []
    for item in select.expressions:
        alias = item.alias if isinstance(item, exp.Alias) else None
        column = item.this if isinstance(item, exp.Alias) else item
        if not isinstance(column, exp.Column) or not isinstance(column.this, exp.Identifier) or column.args.get("db") \
                or column.table and column.table.lower() != name:
            return None
        columns.append((column.name, alias))
    return Picks(table.name, tuple(columns)) if columns else None
