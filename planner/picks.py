"""Which statements only pick rows and columns of one relation.

The executor may take those in Arrow (engine/exec/picks.py).
"""

from __future__ import annotations

import re

from sqlglot import exp

from quail.engine.exec.picks import (AllColumns, AllOf, AnyOf, AsText, Column, Compare, Condition, IsNull, Item, Not,
                                     Picks, RowNumber, Value)

_PICKS_ONLY = ("expressions", "from_", "where")  # a SELECT's parts that picking rows and columns may have
_FLIPPED = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_OPS = {exp.EQ: "=", exp.NEQ: "<>", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}
_IN_LIST_MOST = 64  # a longer IN list runs in DuckDB


def picks_of(select: exp.Expression) -> Picks | None:
    """What a `SELECT` from one table does where it only picks rows and columns (nothing else: no join,
    grouping, order, limit or DISTINCT); None for any other statement.

    Its columns may be plain columns (perhaps aliased), all columns, `ROW_NUMBER() OVER ()` or a column
    cast to text; its WHERE may compare columns with integers and strings (=, <>, <, <=, >, >=, BETWEEN,
    IN), test them for NULL, and combine those with AND, OR and NOT.

    >>> from sqlglot import parse_one
    >>> picks_of(parse_one('SELECT r.id, body AS b FROM "__quail_ai_2" AS r'))
    Picks(source='__quail_ai_2', items=(Column(name='id', alias=None), Column(name='body', alias='b')), where=None)
    >>> picks_of(parse_one('SELECT r.*, CAST(body AS TEXT) AS t FROM reviews AS r WHERE id BETWEEN 1 AND 5')).where
    AllOf(terms=(Compare(column='id', op='>=', value=1), Compare(column='id', op='<=', value=5)))
    >>> picks_of(parse_one('SELECT id FROM t WHERE id + 1 > 1')) is None
    True
    >>> picks_of(parse_one('SELECT id + 1 AS id FROM t')) is None
    True
    >>> picks_of(parse_one('SELECT t.id FROM t AS r')) is None
    True
    """
    if not isinstance(select, exp.Select) or any(v for k, v in select.args.items() if k not in _PICKS_ONLY):
        return None
    table = select.args["from_"].this if select.args.get("from_") else None
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier) \
            or any(v for k, v in table.args.items() if k not in ("this", "alias")) \
            or table.args.get("alias") is not None and table.args["alias"].columns:
        return None  # a table in a schema, sampled, or with its columns renamed (`AS r(a, b)`)
    source = table.alias_or_name.lower()  # DuckDB knows an aliased table by its alias alone
    items = [_item(node, source) for node in select.expressions]
    where = select.args.get("where")
    try:
        condition = _condition(where.this, source) if where is not None else None
    except RecursionError:  # conditions nested deeper than Python recurses: DuckDB takes them
        return None
    if not items or any(item is None for item in items) or where is not None and condition is None:
        return None
    return Picks(table.name, tuple(items), condition)


def _column(node: exp.Expression, source: str) -> str | None:
    """The name of a plain column of the source, as written; None for anything else."""
    if not isinstance(node, exp.Column) or not isinstance(node.this, exp.Identifier) or node.args.get("db") \
            or node.table and node.table.lower() != source:
        return None
    return node.name


def _item(node: exp.Expression, source: str) -> Item | None:
    star = node.this if isinstance(node, exp.Column) and isinstance(node.this, exp.Star) and \
        not node.args.get("db") and node.table.lower() == source else node
    if isinstance(star, exp.Star):
        return AllColumns() if not any(star.args.values()) else None  # no EXCLUDE, REPLACE or RENAME
    alias = node.alias if isinstance(node, exp.Alias) else None
    inner = node.this if isinstance(node, exp.Alias) else node
    if isinstance(inner, exp.Column):
        name = _column(inner, source)
        return Column(name, alias) if name is not None else None
    if alias is None:
        return None
    if isinstance(inner, exp.Window) and isinstance(inner.this, exp.RowNumber) and not any(
            v for k, v in inner.args.items() if k not in ("this", "over")) and not any(inner.this.args.values()):
        return RowNumber(alias)
    if type(inner) is exp.Cast and inner.to.is_type(exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR) \
            and not inner.to.expressions and not any(v for k, v in inner.args.items() if k not in ("this", "to")):
        name = _column(inner.this, source)
        return AsText(name, alias) if name is not None else None
    return None


def _value(node: exp.Expression) -> Value | None:
    """A string or a plain integer literal's value (None: any other expression)."""
    negative = isinstance(node, exp.Neg)
    node = node.this if negative else node
    if not isinstance(node, exp.Literal):
        return None
    if node.is_string:
        return None if negative else node.this
    return (-1 if negative else 1) * int(node.this) if re.fullmatch(r"[0-9]+", node.this) else None


def _condition(node: exp.Expression, source: str) -> Condition | None:
    """The condition a WHERE clause's expression is, where Arrow can evaluate it; None otherwise."""
    if isinstance(node, exp.Paren):
        return _condition(node.this, source)
    if isinstance(node, (exp.And, exp.Or)):  # a chain of one connective as one list: no recursion along it
        terms = tuple(_condition(term, source) for term in node.flatten())
        if any(t is None for t in terms):
            return None
        return AllOf(terms) if isinstance(node, exp.And) else AnyOf(terms)
    if isinstance(node, exp.Not):
        inner = _condition(node.this, source)
        return Not(inner) if inner is not None else None
    if type(node) in _OPS:
        op = _OPS[type(node)]
        column, value = _column(node.this, source), _value(node.expression)
        if column is None:
            column, value, op = _column(node.expression, source), _value(node.this), _FLIPPED[op]
        return Compare(column, op, value) if column is not None and value is not None else None
    if isinstance(node, exp.Between) and not node.args.get("symmetric"):
        column, low, high = _column(node.this, source), _value(node.args["low"]), _value(node.args["high"])
        if column is None or low is None or high is None:
            return None
        return AllOf((Compare(column, ">=", low), Compare(column, "<=", high)))
    if isinstance(node, exp.In) and not any(v for k, v in node.args.items() if k not in ("this", "expressions")):
        column, values = _column(node.this, source), [_value(v) for v in node.expressions]
        if column is None or not values or len(values) > _IN_LIST_MOST or any(v is None for v in values):
            return None
        return AnyOf(tuple(Compare(column, "=", v) for v in values))
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        column = _column(node.this, source)
        return IsNull(column) if column is not None else None
    return None
