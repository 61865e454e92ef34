"""What SQL may run in DuckDB: statements as DuckDB parses them, checked before they run.

- The database opens with no external access and its configuration locked
  (database.py): no statement reads or writes a file, the network or an
  extension, or changes a setting. Statements of the kinds that exist to
  reach outside (COPY, EXPORT, ATTACH, DETACH, INSTALL / LOAD) are refused
  here first, with Quail's own message.
- A query reads at most MAX_TABLES table references: DuckDB's planning of
  more takes minutes and does not stop for a time limit. A query that passed
  passes again at once, and so does one that differs from it only in its
  numbers (a dashboard's statements differ in the numbers they filter on).
- A statement joins at most MAX_CONNECTIVES conditions with AND / OR: DuckDB's
  optimizer takes seconds over 2,000 ANDed comparisons, minutes over 4,000,
  and ends the process over 40,000 (a list of values is one IN (...)).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Iterator

import duckdb

from quail.engine.errors import InvalidArgument, ResourceExhausted

MAX_TABLES = 64  # table references in one statement (DuckDB plans a 64-way join in 0.1 s, 200 in 11 s)
MAX_CONNECTIVES = 1000  # ANDs and ORs in one statement (DuckDB optimizes 1,000 ANDed comparisons in 0.5 s)
REFUSED = frozenset({"COPY", "EXPORT", "LOAD", "EXTENSION", "ATTACH", "DETACH", "COPY_DATABASE"})
_NUMBER = re.compile(r"(?=\.?[0-9])[0-9]*(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?")  # a plain decimal number


@functools.cache
def _parser() -> duckdb.DuckDBPyConnection:
    """A database of no tables whose connections parse statements (extract_statements, json_serialize_sql)."""
    return duckdb.connect(config={"enable_external_access": False})


def statements(sql: str) -> list[tuple[str, str]]:
    """The text's statements as DuckDB parses them: (kind, text) each, kind DuckDB's statement type (SELECT,
    INSERT, CREATE, TRANSACTION, ...); InvalidArgument for a syntax error (DuckDB's message, with the
    line and the place) or a statement of a refused kind; ResourceExhausted past MAX_CONNECTIVES."""
    check_size(sql)
    with _parser().cursor() as con:
        try:
            parsed = con.extract_statements(sql)
        except duckdb.Error as err:
            raise InvalidArgument(str(err)) from None
    found = [(statement.type.name, statement.query.strip()) for statement in parsed]
    for kind, text in found:
        if kind in REFUSED:
            raise InvalidArgument(f"{kind.replace('_', ' ')} statements are not available: Quail's statements "
                                  f"reach only its own database ({text[:60]!r})")
    return found


@functools.lru_cache(maxsize=4096)
def check(sql: str) -> None:
    """InvalidArgument when a query reads more than MAX_TABLES table references (other statements pass),
    ResourceExhausted past MAX_CONNECTIVES; a text that passed is not looked at again (a prepared statement
    runs many times)."""
    check_size(sql)
    _check_shape(shape(sql))


def check_size(sql: str, max_tokens: int | None = None) -> None:
    """ResourceExhausted when a text has more than `max_tokens` tokens (None: any number) or joins more than
    MAX_CONNECTIVES conditions with AND / OR, as DuckDB's tokenizer (C++, 0.07 s for 160,000 tokens) counts
    them."""
    tokens = duckdb.tokenize(sql)
    if max_tokens is not None and len(tokens) > max_tokens:
        raise ResourceExhausted(f"the statement has {len(tokens):,} tokens: Quail plans at most {max_tokens:,} "
                                f"(in the duckdb dialect a statement without AI functions goes to DuckDB as "
                                f"written, unparsed)")
    count = sum(kind == duckdb.token_type.keyword and sql[start:end].strip().upper() in ("AND", "OR")
                for start, end, kind in _spans(sql, tokens))
    if count > MAX_CONNECTIVES:
        raise ResourceExhausted(f"the statement joins {count:,} conditions with AND / OR: at most {MAX_CONNECTIVES:,} "
                                f"are planned (DuckDB's optimizer takes minutes over thousands); a list of "
                                f"values is one IN (...)")


def _spans(sql: str, tokens: list[tuple[int, Any]]) -> Iterator[tuple[int, int, Any]]:
    """Each of DuckDB's tokens of the statement as (start, where the next begins, kind)."""
    for (start, kind), (following, _) in zip(tokens, tokens[1:] + [(len(sql), None)]):
        yield start, following, kind


def shape(sql: str) -> str:
    """The statement with each number written 1: the tables it names are its own (a number decides none of
    them, and 1 is a valid width, scale or index wherever a number is). Only plain numbers standing alone
    are rewritten: a statement with any other (a hex literal, a number run into a name) is its own shape.

    >>> shape("SELECT * FROM t WHERE id BETWEEN 100 AND 119.5 AND x < -2e3 AND s = '7'")
    "SELECT * FROM t WHERE id BETWEEN 1 AND 1 AND x < -1 AND s = '7'"
    >>> shape("SELECT 0x1F, 5 FROM t"), shape("SELECT t.1, 5 FROM t")
    ('SELECT 0x1F, 5 FROM t', 'SELECT t.1, 5 FROM t')
    """
    parts, done = [], 0
    for start, following, kind in _spans(sql, duckdb.tokenize(sql)):
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
def _check_shape(sql: str) -> None:
    with _parser().cursor() as con:
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [sql]).fetchall()[0][0])
    if tree.get("error"):
        return  # not a query DuckDB serializes: DuckDB's own parse and bind judge it
    tables = sum(node.get("type") in ("TABLE_FUNCTION", "BASE_TABLE") for node in _nodes(tree))
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
