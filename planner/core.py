"""The AI core of one SELECT: its tables, the conditions on them and its AI calls, bound from the syntax tree.

`bind_core` reads a SELECT with AI functions into an `AICore`; the rules
(planner/rules/) rewrite it; emit.py turns it into plan steps. As bound, a
core asks the model as the query is written: every condition on one table
after that table's AI filters, the filters in the query's order, no LIMIT
reaching the model, the tables joined in the query's order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from sqlglot import exp

from quail.engine.errors import InvalidArgument
from quail.engine.runtime.estimates import CHARS_PER_TOKEN
from quail.planner.ai_calls import AICall, ai_calls, ai_name, ancestors, bind, contains_ai
from quail.planner.dialects import position
from quail.planner.join_order import PLAIN_SELECTIVITY, Edge, Rank, by_tokens
from quail.planner.subqueries import Scope, sources

FRAME_TOKENS = 30  # preamble, document labels, answer cue
SHORT_TOKENS = 8  # an argument that is not a column of a stored table
UNKNOWN_ROWS = 1000  # a relation materialized earlier in the same query
MAX_TABLES = 32  # tables one SELECT with AI functions joins


@dataclass
class Condition:
    """A conjunct of WHERE / ON: the relations it names, and its AI call if it is an AI filter.

    `on` is the alias of the table whose JOIN ... ON holds it; `outer_on` the same
    for a LEFT, RIGHT or FULL join (None: WHERE or an inner join's ON).
    """

    node: exp.Expression
    refs: frozenset[str]
    call: AICall | None = None
    on: str | None = None
    outer_on: str | None = None

    @property
    def relational(self) -> bool:
        """Whether it asks nothing of the model (no AI call, no AI value read)."""
        return self.call is None and not contains_ai(self.node)


@dataclass
class Relation:
    """One table of the FROM clause and its core: the rows that pass every condition on it alone.

    The core runs `before` in its first DuckDB statement, then asks `filters`
    (at most `limit` rows passing them, where set), then its AI values
    (`values`), then `after` (conditions on those values, and relational ones
    not run before). `core` and `ai_columns` are filled when it is emitted.
    """

    alias: str
    table: exp.Table
    columns: dict[str, str]  # each column by the name the query reads it by (lower case) -> its stored name
    side: str = ""  # the join that adds it: "" (inner, cross, the first table), LEFT, RIGHT or FULL
    outer: bool = False  # its slot may be NULL in the joined tuples (planner.py's docstring)
    rows: float = 0.0  # the core's estimated rows
    before: list[Condition] = field(default_factory=list)
    filters: list[AICall] = field(default_factory=list)
    limit: int | None = None
    after: list[Condition] = field(default_factory=list)
    core: str = ""
    ai_columns: list[str] = field(default_factory=list)


@dataclass
class AICore:
    """One SELECT's AI core, as bound and as the rules leave it.

    `pending`: the conditions on several tables (or waiting for the outer
    joins), applied as the tables join; `final`: those the final statement
    applies; `values`: each AI value's id(node) → (the relations it names, its
    call); `orders`: the join orders kept, best first, and `pick` chooses among
    them by the cores' observed rows (None: the first); `rank` prices a join
    order's model work; `join_order` forces one (table aliases); `notes`: the
    planner's words on its choices (EXPLAIN shows them).
    """

    select: exp.Select
    scope: Scope
    relations: list[Relation]
    pending: list[Condition]
    final: list[Condition]
    values: dict[int, tuple[frozenset[str], AICall]]
    orders: list[list[int]]
    pick: Callable[[list[int]], int] | None = None
    rank: Rank = by_tokens
    join_order: Sequence[str] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def orders_joins(self) -> bool:
        """Whether the planner chooses the join order: several tables, inner joins only, no forced order."""
        return len(self.relations) > 1 and self.join_order is None and not any(r.side for r in self.relations)

    def refs(self, node: exp.Expression) -> frozenset[str]:
        """Aliases of the relations whose columns the node reads (outside nested subqueries)."""
        return _refs(node, self.relations)

    def edge(self, condition: Condition) -> Edge:
        """A condition on several tables as the join order search sees it."""
        index = {r.alias: i for i, r in enumerate(self.relations)}
        refs = frozenset(index[a] for a in condition.refs)
        call = condition.call
        if call is None:
            return Edge(refs, PLAIN_SELECTIVITY)
        tokens, question = self.prompt_tokens(call)
        anchor = self.relations.index(self.anchor_relation(call, condition.refs))
        rest = sum(tokens) - tokens[call.anchor] + question
        return Edge(refs, call.expected_selectivity, True, anchor, tokens[call.anchor], rest,
                    self.resident_share(call, call.anchor))

    def anchor_relation(self, call: AICall, refs: frozenset[str]) -> Relation:
        """The relation whose rows hold the documents of a call's anchor, asked over the relations `refs`:
        the one its anchor argument names, else the first of them in the FROM clause."""
        named = self.refs(call.args[call.anchor])
        return next(r for r in self.relations if r.alias in (named if len(named) == 1 else refs))

    def prompt_tokens(self, call: AICall) -> tuple[list[float], float]:
        """Estimated tokens of each PROMPT argument, and of the question with the prompt's frame."""
        return [self._tokens(arg) for arg in call.args], len(call.template) / CHARS_PER_TOKEN + FRAME_TOKENS

    def resident_share(self, call: AICall, index: int) -> float:
        """The share of the tokens of PROMPT argument `index`'s documents resident in the KV pool now, as that
        placeholder's documents after the preamble (0: not a stored table's column, or the pool unseen)."""
        column = self._column(call.args[index])
        return self.scope.resident_share(*column, index) if column is not None else 0.0

    def expected_documents(self, call: AICall, rows: float) -> tuple[float, float] | None:
        """Estimated tokens of the anchor documents that `rows` rows ask a call about, and how many of them
        are resident in the KV pool now (None: the planner does not see the pool, or the plan does not carry
        them: Scope.documents)."""
        if self.scope.resident is None or not self.scope.documents:
            return None
        tokens = rows * self._tokens(call.args[call.anchor])
        return tokens, tokens * self.resident_share(call, call.anchor)

    def rows_asked(self, relation: Relation) -> float:
        """Estimated rows its table's first AI call asks about: the table's rows after the conditions that
        run before its AI filters."""
        return _stored_rows(self.scope, relation) * PLAIN_SELECTIVITY ** len(relation.before)

    def _tokens(self, arg: exp.Expression) -> float:
        """Estimated tokens of a PROMPT argument: a column's mean length, else a short value."""
        column = self._column(arg)
        chars = self.scope.mean_chars(*column) if column is not None else None
        return SHORT_TOKENS if chars is None else chars / CHARS_PER_TOKEN

    def _column(self, arg: exp.Expression) -> tuple[str, str] | None:
        """(table, column) of a PROMPT argument that is a column of one of the core's relations, else None."""
        if not isinstance(arg, exp.Column) or isinstance(arg.this, exp.Star):
            return None
        (alias,) = self.refs(arg)
        relation = next(r for r in self.relations if r.alias == alias)
        return relation.table.name, relation.columns.get(arg.name.lower(), arg.name)


def bind_core(select: exp.Select, scope: Scope, rank: Rank = by_tokens,
              join_order: Sequence[str] | None = None) -> AICore:
    """The SELECT's AI core as the query is written (the module docstring)."""
    relations = _relations(select, scope)
    conditions = _conditions(select, relations)
    values = _ai_values(select, relations, conditions)
    for relation in relations:
        _take_local(relation, relations, conditions, scope)
    late = late_where(relations)
    final = [c for c in conditions if c.call is None and (len(c.refs) > 1 and contains_ai(c.node)
                                                          or late and c.on is None)]
    pending = [c for c in conditions if c not in final]
    return AICore(select, scope, relations, pending, final, values, [_query_order(relations, join_order)], None,
                  rank, join_order)


def _query_order(relations: list[Relation], join_order: Sequence[str] | None) -> list[int]:
    """The tables' join order as the query writes them, or as `join_order` forces it."""
    aliases = [r.alias.lower() for r in relations]
    if join_order is None or len(relations) < 2:
        return list(range(len(relations)))
    forced = [a.lower() for a in join_order]
    if sorted(forced) != sorted(aliases):
        raise InvalidArgument(f"a forced join order must name each of {', '.join(aliases)} once")
    return [aliases.index(a) for a in forced]


def late_where(relations: list[Relation]) -> bool:
    """Whether WHERE waits for every join: a RIGHT or FULL join may NULL-extend tables joined before it."""
    return any(r.side in ("RIGHT", "FULL") for r in relations)


def _unsupported(node: exp.Expression, what: str) -> InvalidArgument:
    return InvalidArgument(f"{what} is not supported yet{position(node)}")


def _relations(select: exp.Select, scope: Scope) -> list[Relation]:
    joins = select.args.get("joins") or []
    for join in joins:
        if join.args.get("using") or join.kind not in ("", "INNER", "CROSS", "OUTER"):
            raise _unsupported(join, "a USING, NATURAL or special join in a query with AI functions")
    relations = []
    for source, join in zip(sources(select), [None, *joins]):
        if not isinstance(source, exp.Table) or not scope.has(source.name):
            raise _unsupported(source, "this kind of FROM source in a query with AI functions")
        columns = _named_columns(source, scope.schema(source.name).names)
        relations.append(Relation(source.alias_or_name, source, columns, side=join.side if join is not None else ""))
    if len(relations) > MAX_TABLES:
        raise InvalidArgument(f"a SELECT with AI functions joins at most {MAX_TABLES} tables, not "
                              f"{len(relations)}: join the others in a subquery{position(select)}")
    if len({r.alias.lower() for r in relations}) != len(relations):
        raise InvalidArgument("each table of a query with AI functions needs its own alias")
    for i, relation in enumerate(relations):
        relation.outer = relation.side in ("LEFT", "FULL") or any(r.side in ("RIGHT", "FULL")
                                                                    for r in relations[i + 1:])
    return relations


def _named_columns(source: exp.Table, stored: list[str]) -> dict[str, str]:
    """Each column of a FROM table by the name the query reads it by (lower case; `AS r(x, y)` renames the
    first ones), to its name in the stored table."""
    alias = source.args.get("alias")
    renamed = [column.name for column in alias.columns] if alias is not None else []
    return {(renamed[i] if i < len(renamed) else name).lower(): name for i, name in enumerate(stored)}


def _refs(node: exp.Expression, relations: list[Relation]) -> frozenset[str]:
    by_alias = {r.alias.lower(): r.alias for r in relations}
    refs = set()
    for column in node.find_all(exp.Column):
        if isinstance(column.this, exp.Star):
            continue
        nested = _nested_select(column, node)
        if nested is not None:  # read by a subquery: a ref only when it is one of ours (correlated)
            if column.table and column.table.lower() in by_alias and column.table.lower() not in {
                    s.alias_or_name.lower() for s in sources(nested)}:
                refs.add(by_alias[column.table.lower()])
            continue
        if column.table:
            alias = by_alias.get(column.table.lower())
            if alias is None:
                raise InvalidArgument(f"unknown table or alias {column.table!r}{position(column)}")
            refs.add(alias)
            continue
        owners = [r.alias for r in relations if column.name.lower() in r.columns]
        if not owners:
            raise InvalidArgument(f"column {column.name!r} not found{position(column)}")
        if len(owners) > 1:
            raise InvalidArgument(f"column {column.name!r} is ambiguous ({', '.join(owners)}){position(column)}")
        refs.add(owners[0])
    return frozenset(refs)


def _nested_select(column: exp.Expression, node: exp.Expression) -> exp.Select | None:
    """The innermost SELECT between the column and the node (a subquery reading it), or None."""
    for parent in (column, *ancestors(column)):
        if parent is node:
            return None
        if isinstance(parent, exp.Select):
            return parent
    return None


def conjuncts(condition: exp.Expression | None) -> list[exp.Expression]:
    """The top-level AND terms of a condition, in order (without recursion: thousands of terms are fine)."""
    terms, todo = [], [condition] if condition is not None else []
    while todo:
        node = todo.pop()
        if isinstance(node, exp.Paren):
            todo.append(node.this)
        elif isinstance(node, exp.And):
            todo += [node.right, node.left]
        else:
            terms.append(node)
    return terms


def _conditions(select: exp.Select, relations: list[Relation]) -> list[Condition]:
    where = select.args.get("where")
    terms = [(t, None) for t in conjuncts(where.this if where else None)]
    for join, relation in zip(select.args.get("joins") or [], relations[1:]):
        terms += [(t, relation) for t in conjuncts(join.args.get("on"))]
    out = []
    for term, joined in terms:
        call = bind(term) if ai_name(term) else None
        if call is not None and call.kind != "filter":
            call = None
        on = joined.alias if joined is not None else None
        out.append(Condition(term, _refs(term, relations), call, on,
                             on if joined is not None and joined.side else None))
    return out


def _ai_values(select: exp.Select, relations: list[Relation],
               conditions: list[Condition]) -> dict[int, tuple[frozenset[str], AICall]]:
    """AI calls that are values (not top-level filter conditions): id(call node) → (the relations it names,
    bound call). A value naming one relation is computed on its core, one naming several on the joined tuples."""
    filters = {id(c.node) for c in conditions if c.call is not None}
    values: dict[int, tuple[frozenset[str], AICall]] = {}
    for node in ai_calls(select):
        if any(ai_name(a) for a in ancestors(node)):
            raise InvalidArgument(f"AI functions cannot be nested{position(node)}")
        if id(node) in filters:
            continue
        if any(isinstance(n, exp.AggFunc) for n in node.walk()):
            raise InvalidArgument(f"an AI function over aggregates is not supported yet: compute them in a "
                                  f"subquery and ask about its columns{position(node)}")
        values[id(node)] = (_refs(node, relations) or frozenset({relations[0].alias}), bind(node))
    return values


def _take_local(relation: Relation, relations: list[Relation], conditions: list[Condition], scope: Scope) -> None:
    """Move the conditions on this table alone from `conditions` into its core, and estimate its rows.

    A LEFT JOIN's ON conditions on its right side alone narrow that side; its
    other conditions, the ON conditions of RIGHT and FULL joins, and WHERE
    conditions on a table whose rows may come out NULL-extended wait for the joins.
    """
    alias = relation.alias
    own = alias if relation.outer else None
    local = [c for c in conditions if c.refs <= {alias} and (c.refs or relation is relations[0])
             and (c.outer_on == own if relation.side == "LEFT" else c.outer_on is None and not relation.outer)]
    for condition in local:
        conditions.remove(condition)
    relation.filters = [c.call for c in local if c.call is not None]
    relation.after = [c for c in local if c.call is None and contains_ai(c.node)] + \
        [c for c in local if c.relational]
    relation.rows = _stored_rows(scope, relation) * PLAIN_SELECTIVITY ** sum(
        c.relational for c in local) * math.prod(call.expected_selectivity for call in relation.filters)


def _stored_rows(scope: Scope, relation: Relation) -> float:
    """The rows of the relation's table (UNKNOWN_ROWS for one materialized earlier in the query)."""
    stored = scope.rows(relation.table.name)
    return UNKNOWN_ROWS if stored is None else stored
