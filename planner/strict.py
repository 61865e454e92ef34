"""Strict SQL: token sequences sqlglot would parse leniently (and silently repair) refused with their position.

sqlglot recovers from some malformed SQL instead of failing: it drops an empty
list item (`round(, 1)`), reads `JOIN t ON` with nothing after as a cross
join, takes a keyword after AS or IS as a name, a missing closing parenthesis
as present, `> >` as a shift. Running such a repair would answer a question
the user did not ask, so each is an error here, found on the tokens before
parsing. So is nesting deeper than MAX_NESTING (the parser recurses per
level).
"""

from __future__ import annotations

from typing import Callable

from sqlglot.tokens import Token, TokenType

from quail.engine.errors import InvalidArgument

MAX_NESTING = 32  # parentheses, brackets, CASEs and NOTs one inside another
T = TokenType
_PAIRS = {T.R_PAREN: T.L_PAREN, T.R_BRACKET: T.L_BRACKET, T.R_BRACE: T.L_BRACE, T.END: T.CASE}
_OPEN, _CLOSE = set(_PAIRS.values()), set(_PAIRS)
_CLAUSE = {T.SEMICOLON, T.COMMA, T.WHERE, T.GROUP_BY, T.ORDER_BY, T.HAVING, T.LIMIT, T.OFFSET, T.FETCH, T.JOIN,
           T.INNER, T.LEFT, T.RIGHT, T.FULL, T.CROSS, T.OUTER, T.NATURAL, T.ASOF, T.POSITIONAL, T.SEMI, T.ANTI,
           T.UNION, T.EXCEPT, T.INTERSECT, T.QUALIFY, T.WINDOW, T.ON, T.USING, T.OR, T.FROM, T.THEN, T.ELSE,
           T.WHEN, T.BETWEEN} | _CLOSE  # tokens no expression starts with, nor continues through at its level
_COMPARISONS = {T.EQ, T.NEQ, T.GT, T.GTE, T.LT, T.LTE}
_LIST_STARTS = {T.COMMA, T.L_PAREN, T.L_BRACKET, T.SELECT, T.DISTINCT, T.GROUP_BY, T.ORDER_BY, T.PARTITION_BY}
_UNCONDITIONAL = {T.CROSS, T.NATURAL, T.POSITIONAL}  # joins that take no ON
_SECTIONS = {T.SELECT, T.FROM, T.JOIN, T.ON, T.USING, T.WHERE, T.GROUP_BY, T.HAVING, T.ORDER_BY, T.QUALIFY,
             T.LIMIT, T.WINDOW, T.VALUES}  # where a statement's parts begin
Problem = tuple[Token, str] | None


def check(tokens: list[Token]) -> None:
    """InvalidArgument, at the first offending token, unless the statement's tokens pass every rule (each
    token tried against the rules that start at its kind, in RULES' order)."""
    _check_nesting(tokens)
    for i, token in enumerate(tokens):
        for rule in _STARTING.get(token.token_type, ()):
            problem = rule(tokens, i)
            if problem is not None:
                refuse(*problem)


def refuse(token: Token, what: str) -> None:
    column = max(1, token.col - len(token.text) + 1)  # sqlglot's col is the token's last character
    raise InvalidArgument(f"SQL syntax error at line {token.line}, column {column}: {what} near {token.text!r}")


def _check_nesting(tokens: list[Token]) -> None:
    """Brackets, parentheses and CASE ... END balanced and nested at most MAX_NESTING deep (NOTs count)."""
    stack: list[Token] = []
    nots = 0
    for token in tokens:
        kind = token.token_type
        nots = nots + 1 if kind == T.NOT else 0
        if kind in _OPEN:
            stack.append(token)
        elif kind in _CLOSE:
            if not stack or stack[-1].token_type != _PAIRS[kind]:
                refuse(token, "unbalanced brackets, parentheses or CASE ... END")
            stack.pop()
        if len(stack) + nots > MAX_NESTING:
            refuse(token, f"expressions nest more than {MAX_NESTING} deep")
    if stack:
        refuse(stack[-1], "this is never closed")


def _after(tokens: list[Token], i: int) -> TokenType | None:
    return tokens[i + 1].token_type if i + 1 < len(tokens) else None


def _empty_item(tokens: list[Token], i: int) -> Problem:
    kind, after = tokens[i].token_type, _after(tokens, i)
    if (kind in _LIST_STARTS and after == T.COMMA) or (
            kind == T.COMMA and after in (T.R_PAREN, T.R_BRACKET, T.R_BRACE)):
        return tokens[i + 1], "an empty item in a list"
    return None


def _nothing_after(tokens: list[Token], i: int) -> Problem:
    """ON, AS, IS, IN, USING, OFFSET, LIMIT, PIVOT, UNPIVOT and WINDOW need what follows them (a condition, a name,
    a value, a list, columns, a number, ...: sqlglot would read a bare PIVOT or WINDOW as a table's alias); AS
    also needs an expression before it."""
    kind, after = tokens[i].token_type, _after(tokens, i)
    needs = {T.ON: "ON needs a condition", T.ALIAS: "AS needs a name", T.IS: "IS needs what it tests",
             T.IN: "IN needs a list or a query", T.USING: "USING needs its columns",
             T.OFFSET: "OFFSET needs a number", T.LIMIT: "LIMIT needs a number",
             T.PIVOT: "PIVOT needs what it pivots", T.UNPIVOT: "UNPIVOT needs what it unpivots",
             T.WINDOW: "WINDOW needs its definitions"}.get(kind)
    if needs and (after is None or after in _CLAUSE or (kind == T.ALIAS and after == T.NUMBER)):
        return tokens[i], needs
    if kind == T.ALIAS and i > 0 and tokens[i - 1].token_type in _LIST_STARTS:
        return tokens[i], "AS needs an expression before it"
    if kind == T.NOT and after == T.IS:
        return tokens[i], "NOT IS is not SQL: write IS NOT"
    return None


def _fetch_only(tokens: list[Token], i: int) -> Problem:
    """FETCH FIRST | NEXT [n] ROW | ROWS ONLY | WITH TIES: sqlglot reads `FETCH FIRST` alone as one row."""
    if tokens[i].token_type != T.FETCH:
        return None
    ahead = [token.text.upper() for token in tokens[i + 1:i + 7]]
    if "ONLY" not in ahead and "TIES" not in ahead:
        return tokens[i], "FETCH needs FIRST or NEXT, a count, ROWS and ONLY"
    return None


def _star_modifier(tokens: list[Token], i: int) -> Problem:
    """`* EXCLUDE`, `* REPLACE` and `* RENAME` need what they name (sqlglot drops a bare one); FOR UPDATE and
    FOR SHARE lock rows, which Quail does not (sqlglot drops them)."""
    text, after = tokens[i].text.upper(), _after(tokens, i)
    if text in ("EXCLUDE", "REPLACE", "RENAME", "EXCEPT") and i > 0 and tokens[i - 1].token_type == T.STAR and \
            (after is None or after in _CLAUSE):
        return tokens[i], f"* {text} needs the columns it names"
    if tokens[i].token_type == T.FOR and i + 1 < len(tokens) and tokens[i + 1].text.upper() in ("UPDATE", "SHARE"):
        return tokens[i], "locking reads (FOR UPDATE, FOR SHARE) are not supported: transactions isolate instead"
    return None


def _when_then(tokens: list[Token], i: int) -> Problem:
    """WHEN needs its THEN, past the ORs and BETWEENs of its condition."""
    if tokens[i].token_type == T.WHEN and not _follows(tokens, i + 1, {T.THEN}, through={T.OR, T.BETWEEN}):
        return tokens[i], "WHEN needs THEN"
    return None


def _two_comparisons(tokens: list[Token], i: int) -> Problem:
    """`a > > b`, `a = < b`: two comparisons in a row (`>>` written together is a shift)."""
    if tokens[i].token_type in _COMPARISONS and _after(tokens, i) in _COMPARISONS and \
            tokens[i + 1].start > tokens[i].end + 1:
        return tokens[i + 1], "two comparisons in a row"
    return None


def _two_strings(tokens: list[Token], i: int) -> Problem:
    """'a' 'b': sqlglot would join them; SQL here does not."""
    if tokens[i].token_type == T.STRING and _after(tokens, i) == T.STRING:
        return tokens[i + 1], "two strings in a row: join them with ||"
    return None


def _table_star(tokens: list[Token], i: int) -> Problem:
    """`FROM t *` (a table and its descendants in PostgreSQL): no such tables here."""
    if tokens[i].token_type != T.STAR or i < 1 or tokens[i - 1].token_type not in (T.VAR, T.IDENTIFIER):
        return None
    depth = 0
    for token in reversed(tokens[:i - 1]):
        kind = token.token_type
        depth += (kind in _CLOSE) - (kind in _OPEN)
        if depth < 0 or (depth == 0 and kind in _SECTIONS):
            return (tokens[i], "a table name cannot be followed by *") if kind in (T.FROM, T.JOIN) else None
    return None


def _lateral(tokens: list[Token], i: int) -> Problem:
    """LATERAL starts a FROM item: after FROM, JOIN or a comma, before a subquery or a function."""
    if tokens[i].token_type != T.LATERAL:
        return None
    before = tokens[i - 1].token_type if i > 0 else None
    after = _after(tokens, i)
    if before not in (T.FROM, T.JOIN, T.COMMA) or after is None or after in _CLAUSE or after == T.DOT:
        return tokens[i], "LATERAL belongs in FROM, before a subquery or a function"
    return None


def _join_condition(tokens: list[Token], i: int) -> Problem:
    """A join but CROSS, NATURAL and POSITIONAL needs ON or USING before the next join or clause."""
    if tokens[i].token_type != T.JOIN or any(t.token_type in _UNCONDITIONAL for t in tokens[max(0, i - 2):i]):
        return None
    if not _follows(tokens, i + 1, {T.ON, T.USING}):
        return tokens[i], "JOIN needs ON or USING (CROSS JOIN pairs every row)"
    return None


def _cte(tokens: list[Token], i: int) -> Problem:
    """WITH [RECURSIVE] name [(columns)] AS [[NOT] MATERIALIZED] (query) [, ...]."""
    if tokens[i].token_type != T.WITH:
        return None
    k = i + 1 + (_after(tokens, i) == T.RECURSIVE)
    while True:
        if k >= len(tokens) or tokens[k].token_type in (T.L_PAREN, T.ALIAS, T.COMMA):
            return tokens[min(k, len(tokens) - 1)], "WITH needs a name, AS and a query in parentheses"
        k += 1
        if k < len(tokens) and tokens[k].token_type == T.L_PAREN:
            k = _closing(tokens, k) + 1
        if k >= len(tokens) or tokens[k].token_type != T.ALIAS:
            return tokens[min(k, len(tokens) - 1)], "a WITH query needs AS before its parentheses"
        k += 1
        while k < len(tokens) and tokens[k].text.upper() in ("NOT", "MATERIALIZED"):
            k += 1
        if k >= len(tokens) or tokens[k].token_type != T.L_PAREN:
            return tokens[min(k, len(tokens) - 1)], "a WITH query needs its query in parentheses"
        k = _closing(tokens, k) + 1
        if k >= len(tokens) or tokens[k].token_type != T.COMMA:
            return None
        k += 1


def _closing(tokens: list[Token], start: int) -> int:
    """The index of the token closing the bracket at `start` (balanced: _check_nesting ran)."""
    depth = 0
    for k in range(start, len(tokens)):
        depth += (tokens[k].token_type in _OPEN) - (tokens[k].token_type in _CLOSE)
        if depth == 0:
            return k
    return len(tokens) - 1


def _follows(tokens: list[Token], start: int, wanted: set[TokenType], through: frozenset[TokenType] | set = frozenset()
             ) -> bool:
    """Whether a wanted token at the level of tokens[start] comes before that level's expression ends (at a
    clause token not in `through`)."""
    depth = 0
    for k in range(start, len(tokens)):  # not a slice: WHENs by the thousand would each copy the rest
        kind = tokens[k].token_type
        if depth == 0 and kind in wanted:
            return True
        if depth == 0 and kind in _CLAUSE and kind not in through:
            return False
        depth += (kind in _OPEN) - (kind in _CLOSE)
    return False


RULES: list[tuple[set[TokenType], Callable[[list[Token], int], Problem]]] = [  # the kinds of token each starts at
    (_LIST_STARTS | {T.COMMA}, _empty_item),
    ({T.ON, T.ALIAS, T.IS, T.IN, T.NOT, T.USING, T.OFFSET, T.LIMIT, T.PIVOT, T.UNPIVOT, T.WINDOW}, _nothing_after),
    ({T.WHEN}, _when_then), (_COMPARISONS, _two_comparisons), ({T.STRING}, _two_strings), ({T.STAR}, _table_star),
    ({T.LATERAL}, _lateral), ({T.JOIN}, _join_condition), ({T.WITH}, _cte), ({T.FETCH}, _fetch_only),
    ({T.EXCEPT, T.REPLACE, T.FOR, T.VAR, T.RENAME}, _star_modifier),
]
_STARTING: dict[TokenType, list[Callable[[list[Token], int], Problem]]] = {
    kind: [rule for kinds, rule in RULES if kind in kinds] for kind in set().union(*(kinds for kinds, _ in RULES))}
