"""What SQL may run in DuckDB: each statement's syntax tree, as DuckDB parses it, checked against lists of
what is allowed.

A statement may read the relations registered for it (and its own CTEs),
subqueries, VALUES lists and `unnest`, at most MAX_TABLES of them; no other
table function, and no table of another schema or a file. It may call DuckDB's built-in scalar, aggregate
and window functions and the macros of its main schema, except those that
read the server's settings, session or log, sleep, or touch sequences
(`_WITHHELD`). Anything else is refused before it runs.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Iterator

import duckdb

from quail.engine.errors import InvalidArgument, NotFound

TABLE_FUNCTIONS = frozenset({"unnest"})
_NUMBER = re.compile(r"(?=\.?[0-9])[0-9]*(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?")  # a plain decimal number
MAX_TABLES = 64  # table references in one statement (DuckDB plans a 64-way join in 0.1 s, 200 in 11 s)
_WITHHELD = frozenset({
    "current_setting", "current_query", "current_query_id", "current_connection_id", "current_transaction_id",
    "getvariable", "sleep_ms", "write_log", "parse_duckdb_log_message", "nextval", "currval", "txid_current",
    "json_deserialize_sql", "get_block_size",
})


@functools.cache
def allowed_functions() -> frozenset[str]:
    """The functions a statement may call (DuckDB's own, less those withheld)."""
    with duckdb.connect(config={"enable_external_access": False}) as con:
        rows = con.sql("SELECT DISTINCT function_name FROM duckdb_functions() WHERE schema_name = 'main' AND "
                       "function_type IN ('scalar', 'aggregate', 'window', 'macro')").fetchall()
    return frozenset(name for (name,) in rows) - _WITHHELD


@functools.cache
def _parser() -> duckdb.DuckDBPyConnection:
    """A database of no tables whose connections parse statements (json_serialize_sql)."""
    return duckdb.connect(config={"enable_external_access": False})


def check(sql: str, relations: frozenset[str]) -> None:
    """InvalidArgument unless the statement reads only `relations` (lower-case names), at most MAX_TABLES
    table references, and calls only allowed functions. Statements DuckDB cannot serialize (anything but
    SELECT) are refused too. A statement that passed passes again at once, and so does one that differs
    from it only in its numbers (a plan's steps are checked as its schema is found, then as it runs, each
    time it runs; a dashboard's statements differ in the numbers they filter on)."""
    _check_shape(shape(sql), relations)


def shape(sql: str) -> str:
    """The statement with each number written 1: the tables and functions it names are its own (a number
    decides none of them, and 1 is a valid width, scale or index wherever a number is). Only plain
    numbers standing alone are rewritten: a statement with any other (a hex literal, a number run into a
    name) is its own shape.

    >>> shape("SELECT * FROM t WHERE id BETWEEN 100 AND 119.5 AND x < -2e3 AND s = '7'")
    "SELECT * FROM t WHERE id BETWEEN 1 AND 1 AND x < -1 AND s = '7'"
    >>> shape("SELECT 0x1F, 5 FROM t"), shape("SELECT t.1, 5 FROM t")
    ('SELECT 0x1F, 5 FROM t', 'SELECT t.1, 5 FROM t')
    """
    tokens = duckdb.tokenize(sql)
    parts, done = [], 0
    for (start, kind), (following, _) in zip(tokens, tokens[1:] + [(len(sql), None)]):
        if kind == duckdb.token_type.numeric_const:
            number = sql[start:following].rstrip()
            end = start + len(number)
            if not _NUMBER.fullmatch(number) or _runs_into(sql, start - 1) or _runs_into(sql, end):
                return sql
            parts += [sql[done:start], "1"]
            done = end
    return "".join(parts) + sql[done:]


def _runs_into(sql: str, at: int) -> bool:
    """Whether the character at `at` would join a number beside it into a longer token (a name, a dotted
    name, a parameter, a quoted name)."""
    return 0 <= at < len(sql) and (sql[at].isalnum() or sql[at] in "_.$\"'")


@functools.lru_cache(maxsize=4096)
def _check_shape(sql: str, relations: frozenset[str]) -> None:
    with _parser().cursor() as con:
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [sql]).fetchall()[0][0])
    if tree.get("error"):
        raise InvalidArgument(f"not a query Quail runs: {tree.get('error_message', 'unknown statement')}")
    names = relations | {name.lower() for name in _cte_names(tree)}
    functions = allowed_functions()
    tables = 0
    for node in _nodes(tree):
        kind = node.get("type")
        tables += kind in ("TABLE_FUNCTION", "BASE_TABLE")
        if kind == "TABLE_FUNCTION":
            name = node["function"]["function_name"].lower()
            if name not in TABLE_FUNCTIONS:
                raise InvalidArgument(f"table function {name}() is not available: read tables, subqueries, "
                                      f"VALUES or unnest()")
        elif kind == "BASE_TABLE":
            qualified = node.get("schema_name") or node.get("catalog_name")
            if qualified or node["table_name"].lower() not in names:
                raise NotFound(f"table {node['table_name']!r} does not exist")
        elif node.get("class") in ("FUNCTION", "WINDOW") and not node.get("is_operator") and \
                (node.get("schema") or node.get("catalog") or node["function_name"].lower() not in functions):
            raise InvalidArgument(f"function {node['function_name']}() is not available in Quail")
    if tables > MAX_TABLES:
        raise InvalidArgument(f"a statement reads at most {MAX_TABLES} tables, not {tables}: DuckDB's planning of "
                              f"more takes minutes and does not stop for a time limit")


def _nodes(tree: Any) -> Iterator[dict]:
    """Every JSON object in the tree (without recursion: deep trees are fine)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            yield node
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)


def _cte_names(tree: Any) -> Iterator[str]:
    for node in _nodes(tree):
        for entry in (node.get("cte_map") or {}).get("map", []):
            yield entry["key"]
