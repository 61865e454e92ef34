"""Parsing user SQL in a chosen dialect; syntax errors carry their line and column."""

from __future__ import annotations

import sqlglot
from sqlglot import exp, parser
from sqlglot.dialects.bigquery import BigQuery
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from quail.engine.errors import InvalidArgument

AI_DOTTED = ("IF", "CLASSIFY", "SCORE")


class QuailBigQuery(BigQuery):
    """BigQuery, with `AI.IF(...)` and friends parsed as plain calls (sqlglot maps AI.IF to IF)."""

    class Parser(BigQuery.Parser):
        def _parse_column_ops(self, this: exp.Expression | None) -> exp.Expression | None:
            if (
                isinstance(this, exp.Column)
                and not this.table
                and this.name.upper() == "AI"
                and self._curr is not None
                and self._curr.token_type == TokenType.DOT
                and self._next is not None
                and self._next.text.upper() in AI_DOTTED
            ):
                return parser.Parser._parse_column_ops(self, this)
            return super()._parse_column_ops(this)


DIALECTS = {"snowflake": "snowflake", "bigquery": QuailBigQuery, "duckdb": "duckdb"}
DEFAULT_DIALECT = "snowflake"


def parse_statement(sql: str, dialect: str = DEFAULT_DIALECT) -> exp.Expression:
    """One statement's syntax tree; InvalidArgument names the position of a syntax error."""
    if dialect not in DIALECTS:
        raise InvalidArgument(f"unknown SQL dialect {dialect!r}; use one of {', '.join(DIALECTS)}")
    try:
        trees = [t for t in sqlglot.parse(sql, read=DIALECTS[dialect]) if t is not None]
    except ParseError as err:
        first = err.errors[0] if err.errors else {}
        where = f" at line {first.get('line')}, column {first.get('col')}" if first else ""
        near = (first.get("highlight") or "").strip()
        raise InvalidArgument(
            f"SQL syntax error{where}: {first.get('description', str(err))}" + (f" near {near!r}" if near else "")
        ) from None
    except TokenError as err:
        raise InvalidArgument(f"SQL syntax error: {err}") from None
    if len(trees) != 1:
        raise InvalidArgument(f"expected one SQL statement, got {len(trees)}")
    return trees[0]


def normalize(tree: exp.Expression) -> exp.Expression:
    """Rewrites that keep meaning when DuckDB runs the tree.

    Snowflake's `variant:path::string` is the path's scalar text; a plain cast of
    DuckDB's JSON extraction would keep the JSON quotes, so it becomes `->>`.
    """
    for cast in list(tree.find_all(exp.Cast)):
        inner = cast.this
        if isinstance(inner, exp.JSONExtract) and inner.args.get("variant_extract") and cast.to.is_type(
                exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR):
            cast.replace(exp.JSONExtractScalar(this=inner.this, expression=inner.expression))
    return tree


def position(node: exp.Expression) -> str:
    """' at line L, column C' for a node that knows where it came from, else ''."""
    meta = node.meta
    if "line" not in meta:
        found = next((n for n in node.walk() if "line" in n.meta), None)
        meta = found.meta if found is not None else {}
    return f" at line {meta['line']}, column {meta['col']}" if "line" in meta else ""
