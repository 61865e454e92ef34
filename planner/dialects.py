"""Parsing user SQL in a chosen dialect; syntax errors carry their line and column."""

from __future__ import annotations

from typing import Callable

from sqlglot import exp, parser
from sqlglot.dialects.bigquery import BigQuery
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.dialects.snowflake import Snowflake
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ErrorLevel, ParseError, TokenError
from sqlglot.tokens import TokenType

from quail.engine.errors import InvalidArgument
from quail.engine.exec import sql_guard

from quail.planner import strict

AI_DOTTED = ("IF", "CLASSIFY", "SCORE")


class StrictParser(parser.Parser):
    """Rules every dialect's parser follows here, stricter than sqlglot's own.

    BETWEEN needs its AND
    (sqlglot reads `a BETWEEN 1 b AND c` as `a BETWEEN 1 AND b` joined to `c`); each `?` knows where it was
    written (its line and column: parameters bind in that order, not in the tree's)."""

    def _parse_placeholder(self) -> exp.Expression | None:
        placeholder = super()._parse_placeholder()
        if isinstance(placeholder, exp.Placeholder) and not placeholder.this:
            placeholder.meta.update(line=self._prev.line, col=self._prev.col)
        return placeholder

    def _parse_between(self, this: exp.Expression | None) -> exp.Expression:
        if isinstance(this, (exp.Is, exp.NullSafeEQ, exp.NullSafeNEQ)):  # keep the comparison whole
            this = exp.Paren(this=this)
        symmetric = True if self._match_text_seq("SYMMETRIC") else False if self._match_text_seq("ASYMMETRIC") else None
        low = self._parse_bitwise()
        if not self._match(TokenType.AND):
            self.raise_error("BETWEEN needs AND between its bounds")
        return self.expression(exp.Between(this=this, low=low, high=self._parse_bitwise(), symmetric=symmetric))


def _ai_aggregate(kind: type[exp.Func]) -> Callable[[list[exp.Expression]], exp.Expression]:
    """sqlglot's builder of an AI aggregate, but with one argument more than it takes (options): the call as
    a plain function call, which planner/aggregates.py binds."""
    def build(args: list[exp.Expression]) -> exp.Expression:
        if len(args) == len(kind.arg_types) + 1:
            return exp.Anonymous(this=kind.sql_names()[0], expressions=args)
        return kind.from_arg_list(args)

    return build


AI_AGGREGATES = {"AI_AGG": _ai_aggregate(exp.AIAgg), "AI_SUMMARIZE_AGG": _ai_aggregate(exp.AISummarizeAgg)}


class QuailSnowflake(Snowflake):
    """Snowflake, parsed strictly; AI aggregates may take options."""

    class Parser(StrictParser, Snowflake.Parser):
        FUNCTIONS = {**Snowflake.Parser.FUNCTIONS, **AI_AGGREGATES}


class QuailDuckDB(DuckDB):
    """DuckDB, parsed strictly; AI aggregates may take options."""

    class Parser(StrictParser, DuckDB.Parser):
        FUNCTIONS = {**DuckDB.Parser.FUNCTIONS, **AI_AGGREGATES}


class QuailBigQuery(BigQuery):
    """BigQuery, parsed strictly, with `AI.IF(...)` and friends as plain calls.

    BigQuery, parsed strictly, with `AI.IF(...)` and friends parsed as plain calls (sqlglot maps AI.IF
    to IF)."""

    class Parser(StrictParser, BigQuery.Parser):
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


DIALECTS = {"snowflake": QuailSnowflake, "bigquery": QuailBigQuery, "duckdb": QuailDuckDB}
DEFAULT_DIALECT = "snowflake"
MAX_TOKENS = 50_000  # tokens of a statement the planner parses: about 1.5 s of planning on a core, which holds
# the interpreter from every other statement (a 180,000-token statement held it 7 s)


def parse_statement(sql: str, dialect: str = DEFAULT_DIALECT) -> exp.Expression:
    """One statement's syntax tree (parse_statements, of exactly one statement)."""
    trees = parse_statements(sql, dialect)
    if len(trees) != 1:
        raise InvalidArgument(f"expected one SQL statement, got {len(trees)}")
    return trees[0]


def parse_statements(sql: str, dialect: str = DEFAULT_DIALECT) -> list[exp.Expression]:
    """The syntax tree of each statement of the text; InvalidArgument names the position of a syntax error.

    Parsing is strict (strict.py; BETWEEN without AND: StrictParser): what
    sqlglot would silently repair is an error with its position. A text of more
    than MAX_TOKENS tokens is refused (ResourceExhausted) before it is parsed.
    """
    if dialect not in DIALECTS:
        raise InvalidArgument(f"unknown SQL dialect {dialect!r}; use one of {', '.join(DIALECTS)}")
    reader = Dialect.get_or_raise(DIALECTS[dialect])
    try:
        sql_guard.check_size(sql, MAX_TOKENS)  # before sqlglot's tokenizer, which takes a second a 160,000 tokens
        tokens = reader.tokenize(sql)
        strict.check(tokens)
        trees = [t for t in reader.parser(error_level=ErrorLevel.IMMEDIATE).parse(tokens, sql) if t is not None]
    except ParseError as err:
        first = err.errors[0] if err.errors else {}
        where = f" at line {first.get('line')}, column {first.get('col')}" if first else ""
        near = (first.get("highlight") or "").strip()
        raise InvalidArgument(
            f"SQL syntax error{where}: {first.get('description', str(err))}" + (f" near {near!r}" if near else "")
        ) from None
    except TokenError as err:
        raise InvalidArgument(f"SQL syntax error: {err}") from None
    except RecursionError:
        raise InvalidArgument("the statement nests too deeply to parse") from None
    if not trees:
        raise InvalidArgument("the text holds no SQL statement")
    return trees


_ITEMS_END = {TokenType.FROM, TokenType.WHERE, TokenType.GROUP_BY, TokenType.HAVING, TokenType.ORDER_BY,
              TokenType.LIMIT, TokenType.QUALIFY, TokenType.WINDOW, TokenType.UNION, TokenType.EXCEPT,
              TokenType.INTERSECT, TokenType.SEMICOLON, TokenType.INTO}


def written_items(sql: str, dialect: str) -> list[str]:
    """The text of each item of the outermost SELECT's list, as written (empty: no such list).

    >>> written_items("WITH t AS (SELECT 1 AS a) SELECT DISTINCT var_samp(a),  a IS NOT NULL FROM t", "snowflake")
    ['var_samp(a)', 'a IS NOT NULL']
    """
    tokens = Dialect.get_or_raise(DIALECTS[dialect]).tokenize(sql)
    start = next((k + 1 for k, depth in _depths(tokens) if depth == 0 and tokens[k].token_type == TokenType.SELECT),
                 None)
    if start is None:
        return []
    while start < len(tokens) and tokens[start].token_type in (TokenType.DISTINCT, TokenType.ALL):
        start += 1
    items, first = [], start
    for k, depth in _depths(tokens, start):
        if depth == 0 and tokens[k].token_type in _ITEMS_END | {TokenType.COMMA}:
            items.append(sql[tokens[first].start:tokens[k - 1].end + 1] if k > first else "")
            first = k + 1
            if tokens[k].token_type != TokenType.COMMA:
                return items
    return items + [sql[tokens[first].start:tokens[-1].end + 1]] if first < len(tokens) else items


def _depths(tokens: list, start: int = 0):
    """(index, parenthesis depth before it) of each token from `start`."""
    depth = 0
    for k in range(start, len(tokens)):
        kind = tokens[k].token_type
        depth -= kind in (TokenType.R_PAREN, TokenType.R_BRACKET)
        yield k, depth
        depth += kind in (TokenType.L_PAREN, TokenType.L_BRACKET)


def normalize(tree: exp.Expression) -> exp.Expression:
    """Rewrites that keep meaning when DuckDB runs the tree.

    Snowflake's `variant:path::string` is the path's scalar text; a plain cast of
    DuckDB's JSON extraction would keep the JSON quotes, so it becomes `->>`.
    COUNT_IF counts, as a BIGINT (DuckDB's is a HUGEINT, which Arrow carries as a DECIMAL).
    """
    for count in list(tree.find_all(exp.CountIf)):
        cast = exp.cast(count.copy(), exp.DataType.build("BIGINT"))
        named = isinstance(count.parent, exp.Select)  # a result column: keeps its name
        count.replace(exp.alias_(cast, count.sql("duckdb"), quoted=True) if named else cast)
    for cast in list(tree.find_all(exp.Cast)):
        inner = cast.this
        if isinstance(inner, exp.JSONExtract) and inner.args.get("variant_extract") and cast.to.is_type(
                exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR):
            cast.replace(exp.JSONExtractScalar(this=inner.this, expression=inner.expression))
    return tree


def numbered_parameters(tree: exp.Expression) -> exp.Expression:
    """The tree with each `?` numbered ($1, $2, ... in the order written), so that a rewrite repeating one
    (Snowflake's LENGTH(?) is DuckDB's CASE over TYPEOF(?), LENGTH(?) and OCTET_LENGTH(?)) still reads one value.

    >>> numbered_parameters(parse_statement("SELECT LENGTH(?), ?", "snowflake")).sql("duckdb")
    "SELECT CASE TYPEOF($1) WHEN 'BLOB' THEN OCTET_LENGTH(CAST($1 AS BLOB)) ELSE LENGTH(CAST($1 AS TEXT)) END, $2"
    """
    holders = sorted((p for p in tree.find_all(exp.Placeholder) if not p.this),
                     key=lambda p: (p.meta.get("line", 0), p.meta.get("col", 0)))
    for number, holder in enumerate(holders, start=1):
        holder.replace(exp.Parameter(this=exp.Literal.number(number)))
    return tree


def position(node: exp.Expression) -> str:
    """' at line L, column C' for a node that knows where it came from, else ''."""
    meta = node.meta
    if "line" not in meta:
        found = next((n for n in node.walk() if "line" in n.meta), None)
        meta = found.meta if found is not None else {}
    return f" at line {meta['line']}, column {meta['col']}" if "line" in meta else ""
