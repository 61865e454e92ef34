"""From SQL text to a physical plan: parse, bind, push relational work below AI work, emit steps.

Queries without AI functions run in DuckDB as they are. AI functions inside
CTEs, derived tables and subqueries are planned first, innermost out, each
SELECT materialized (subqueries.py). A SELECT with AI functions is planned
around its AI core:

1. each table of the FROM clause (inner, LEFT, RIGHT or FULL joins) becomes
   a *core*: its rows that pass the conditions on that table alone, relational
   ones first (they are ~free), then AI filters, then AI values (classify,
   score, yes/no used anywhere), then conditions on those values; every core
   row gets a row id. A table whose rows may come out NULL-extended (the right
   side of a LEFT JOIN, everything before a RIGHT JOIN, both sides of a FULL
   JOIN) takes into its core only its own LEFT JOIN's ON conditions;
2. tables join left to right as a relation of row-id tuples; each condition
   on several tables applies as soon as its tables are joined, an AI condition
   or value asked once per distinct combination of rows it names; a LEFT JOIN
   keeps its unmatched left tuples with a NULL slot, a RIGHT JOIN its unmatched
   new rows with NULL slots before them, a FULL JOIN both. With a RIGHT or FULL
   JOIN in the query, WHERE conditions wait until every table is joined;
3. the rest of the query (projection, grouping, ordering, limits) runs in
   DuckDB over the surviving tuples joined back to the cores.

The prompt of every request depends only on the query text and the row values:
an AI condition naming one table is asked in the filter layout, one naming
several in the join layout with {0} as the anchor (or the placeholder its
`anchor` option names).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from sqlglot import exp

from quail.engine.catalog import Catalog
from quail.engine.errors import InvalidArgument
from quail.engine.physical import (CHARS_PER_TOKEN, AIFilterChain, AIStep, JoinChoice, PhysicalPlan, SQLStep, Step,
                                   filter_rank)

from .ai_functions import AICall, ai_calls, ai_name, ancestors, bind, contains_ai
from .binder import bind_parameters, bind_tables
from .correlated import decorrelate
from .dialects import DEFAULT_DIALECT, DIALECTS, normalize, parse_statement, position
from .explain import explain_plan, split_explain
from .join_order import PLAIN_SELECTIVITY, Edge, Rank, Work, best_order, by_tokens, cost, pareto_orders
from .streaming import stream_in_chunks
from .subqueries import Names, Scope, ctes_of, innermost_ai_select, output_columns, reading, sources

RESULT = "__quail_result"
FRAME_TOKENS = 30  # preamble, document labels, answer cue
SHORT_TOKENS = 8  # an argument that is not a column of a stored table
UNKNOWN_ROWS = 1000  # a relation materialized earlier in the same query
ROW_ID = "__quail_rid"
TUPLES = "__quail_t"
DEFAULT_SELECTIVITY = 0.2
MAX_TABLES = 32  # tables one SELECT with AI functions joins
UNLIMITED = 1 << 62  # a LIMIT at least this large limits nothing
ROWS_MISESTIMATED = (0.1, 10.0)  # the estimates' error each kept join order guards against


def plan_sql(sql: str, catalog: Catalog, dialect: str = DEFAULT_DIALECT,
             params: Sequence[Any] | None = None, join_order: Sequence[str] | None = None,
             rank: Rank = by_tokens) -> PhysicalPlan:
    """The physical plan of one query; params bind its `?` placeholders (None binds NULLs).

    `EXPLAIN <query>` plans the query and returns a plan listing its steps;
    `EXPLAIN ANALYZE <query>` a plan that runs it and reports what each step did;
    `EXPLAIN (FORMAT SUBSTRAIT) <query>` one returning its Substrait plan (one binary value).
    join_order forces the order (table aliases) in which the query's AI core
    joins its tables, instead of the cheapest (tests and comparisons); `rank`
    prices a join order's model work (cost.rank_by_sol: the speed of light on
    the serving device; default: tokens).
    """
    explained = split_explain(sql)
    if explained is not None:
        inner, mode = explained
        return explain_plan(plan_sql(inner, catalog, dialect, params, join_order, rank), mode, catalog)
    return plan_query(name_ai_columns(parse_statement(sql, dialect), dialect), catalog, params, join_order, rank)


def plan_query(tree: exp.Expression, catalog: Catalog, params: Sequence[Any] | None = None,
               join_order: Sequence[str] | None = None, rank: Rank = by_tokens) -> PhysicalPlan:
    """plan_sql over a parsed statement (which it rewrites in place): a query, else INVALID_ARGUMENT."""
    if not isinstance(tree, exp.Query):
        raise InvalidArgument(f"only queries are supported here, not {tree.key.upper()} statements")
    tables = bind_tables(tree, catalog)
    parameters = bind_parameters(tree, params)
    normalize(tree)
    names, scope, steps, notes = Names(), Scope(catalog), [], []
    while (inner := innermost_ai_select(tree)) is not None:
        name = names.fresh("sub")
        correlated = decorrelate(inner, scope.has)
        steps += _plan_select(AICorePlanner(inner, scope, names, name, notes, rank=rank), tree)
        if correlated is not None:
            correlated.predicate.replace(correlated.reader(name))
        else:
            inner.replace(reading(name))
    if ai_calls(tree):
        steps += _plan_select(AICorePlanner(tree, scope, names, RESULT, notes, join_order, rank), tree)
    else:
        steps.append(SQLStep(tree.sql("duckdb"), RESULT))
    return stream_in_chunks(PhysicalPlan(tuple(steps), tables, RESULT, parameters, tuple(notes)))


def name_ai_columns(tree: exp.Expression, dialect: str) -> exp.Expression:
    """The parsed statement with each unaliased result column that has AI functions named by its expression
    as written in the dialect (as DuckDB and Snowflake name an expression's column), never by the plan's
    column that computes it."""
    for select in list(tree.find_all(exp.Select)):
        for item in list(select.expressions):
            if not isinstance(item, (exp.Alias, exp.Star)) and contains_ai(item):
                item.replace(exp.alias_(item.copy(), item.sql(DIALECTS[dialect]), quoted=True))
    return tree


def _plan_select(planner: "AICorePlanner", root: exp.Query) -> list[Step]:
    """Steps computing one SELECT with AI calls into the planner's result; its columns join the scope."""
    select, scope = planner.select, planner.catalog
    if not isinstance(select, exp.Select) or select.args.get("from_") is None:
        raise InvalidArgument(f"an AI function outside a SELECT ... FROM is not supported yet"
                              f"{position(ai_calls(select)[0])}")
    steps = _materialize_sources(select, root, scope, planner.names)
    scope.add(planner.result, output_columns(select, scope))
    return steps + planner.plan()


def _materialize_sources(select: exp.Select, root: exp.Query, scope: Scope, names: Names) -> list[Step]:
    """Derived tables and CTE references in a SELECT's FROM become materialized relations."""
    ctes = ctes_of(root)
    steps: list[Step] = []
    for source in sources(select):
        if isinstance(source, exp.Subquery):
            query = body = source.this
        elif isinstance(source, exp.Table) and source.name.lower() in ctes and not source.db:
            body = ctes[source.name.lower()].this
            query = exp.select(exp.Star()).from_(exp.Table(this=exp.to_identifier(source.name)))
            needed = list(ctes)[: list(ctes).index(source.name.lower()) + 1]  # it, and those it may read
            with_ = root.args["with_"].copy()
            with_.set("expressions", [ctes[name].copy() for name in needed])
            query.set("with_", with_)
        else:
            continue
        name = names.fresh("from")
        steps.append(SQLStep(query.sql("duckdb"), name))
        scope.add(name, output_columns(body, scope))
        source.replace(_table(name, source.alias_or_name))
    return steps


def by_rank(calls: list[AICall]) -> list[AICall]:
    """AI filters on one table in the order that asks the model least: ascending rank (physical.filter_rank)."""
    return sorted(calls, key=lambda call: filter_rank(call.template, call.selectivity or DEFAULT_SELECTIVITY))


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


def _grouped(select: exp.Select) -> bool:
    """Whether a SELECT groups its rows: GROUP BY, or an aggregate (not a window's) in its columns or HAVING."""
    parts = [*select.expressions, select.args.get("having")]
    return bool(select.args.get("group")) or any(
        isinstance(n, exp.AggFunc) and not isinstance(n.parent, exp.Window)
        for part in parts if part is not None for n in part.walk())


def _group_keys(select: exp.Select) -> list[exp.Expression]:
    """The GROUP BY expressions, positions and result column names resolved to the expressions they name."""
    group = select.args.get("group")
    named = {item.alias.lower(): item.this for item in select.expressions if isinstance(item, exp.Alias)}
    keys = []
    for key in group.expressions if group is not None else []:
        if isinstance(key, exp.Literal) and key.is_int and 1 <= int(key.this) <= len(select.expressions):
            key = select.expressions[int(key.this) - 1]
            key = key.this if isinstance(key, exp.Alias) else key
        elif isinstance(key, exp.Column) and not key.table and key.name.lower() in named:
            key = named[key.name.lower()]
        keys.append(key)
    return keys


def _check_grouped(call: exp.Expression, keys: list[exp.Expression]) -> None:
    """InvalidArgument unless every column an AI call outside aggregates reads is a GROUP BY key (or in one)."""
    names = {key.name.lower() for key in keys if isinstance(key, exp.Column)}
    for column in call.find_all(exp.Column):
        within = [column, *ancestors(column)]
        if column.name.lower() not in names and not any(key == node for key in keys for node in within):
            raise InvalidArgument(f"{ai_name(call)} reads column {column.name!r}, which is neither grouped nor "
                                  f"aggregated: add it to GROUP BY{position(column)}")


def _ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def _col(table: str, column: str) -> exp.Column:
    return exp.Column(this=_ident(column), table=_ident(table))


def _table(name: str, alias: str) -> exp.Table:
    return exp.Table(this=_ident(name), alias=exp.TableAlias(this=_ident(alias)))


def _and(terms: list[exp.Expression]) -> exp.Expression | None:
    return exp.and_(*(t.copy() for t in terms)) if terms else None


@dataclass
class Relation:
    """One table of the FROM clause, and the plan of its core."""

    alias: str
    table: exp.Table
    columns: set[str]
    core: str = ""
    ai_columns: list[str] = field(default_factory=list)
    side: str = ""  # the join that adds it: "" (inner, cross, the first table), LEFT, RIGHT or FULL
    outer: bool = False  # its slot may be NULL in the joined tuples (see the module docstring)
    rows: float = 0.0  # the core's estimated rows


@dataclass
class Condition:
    """A conjunct of WHERE / ON: the relations it names, and its AI call if it is one.

    `on` is the alias of the table whose JOIN ... ON holds it; `outer_on` the same
    for a LEFT, RIGHT or FULL join (None: WHERE or an inner join's ON).
    """

    node: exp.Expression
    refs: frozenset[str]
    call: AICall | None = None
    on: str | None = None
    outer_on: str | None = None


class AICorePlanner:
    """Plans one SELECT with AI functions (see the module docstring)."""

    def __init__(self, select: exp.Select, catalog: Scope, names: Names, result: str, notes: list[str],
                 join_order: Sequence[str] | None = None, rank: Rank = by_tokens) -> None:
        self.select = select
        self.catalog = catalog
        self.names = names
        self.result = result
        self.notes = notes
        self.join_order = join_order
        self.rank = rank
        self.steps: list[Step] = []
        self.tuple_columns: list[str] = []  # AI values over several tables, columns of the joined tuples

    def _name(self, stem: str) -> str:
        return self.names.fresh(stem)

    def _unsupported(self, node: exp.Expression, what: str) -> InvalidArgument:
        return InvalidArgument(f"{what} is not supported yet{position(node)}")

    # -- binding ---------------------------------------------------------------------------

    def _relations(self) -> list[Relation]:
        joins = self.select.args.get("joins") or []
        for join in joins:
            if join.args.get("using") or join.kind not in ("", "INNER", "CROSS", "OUTER"):
                raise self._unsupported(join, "a USING, NATURAL or special join in a query with AI functions")
        relations = []
        for source, join in zip(sources(self.select), [None, *joins]):
            if not isinstance(source, exp.Table) or not self.catalog.has(source.name):
                raise self._unsupported(source, "this kind of FROM source in a query with AI functions")
            alias = source.alias_or_name
            columns = {n.lower() for n in self.catalog.schema(source.name).names}
            relations.append(Relation(alias, source, columns, side=join.side if join is not None else ""))
        if len(relations) > MAX_TABLES:
            raise InvalidArgument(f"a SELECT with AI functions joins at most {MAX_TABLES} tables, not "
                                  f"{len(relations)}: join the others in a subquery{position(self.select)}")
        if len({r.alias.lower() for r in relations}) != len(relations):
            raise InvalidArgument("each table of a query with AI functions needs its own alias")
        for i, relation in enumerate(relations):
            relation.outer = relation.side in ("LEFT", "FULL") or any(r.side in ("RIGHT", "FULL")
                                                                        for r in relations[i + 1:])
        return relations

    def _refs(self, node: exp.Expression, relations: list[Relation]) -> frozenset[str]:
        """Aliases of the relations whose columns the node reads (outside nested subqueries)."""
        by_alias = {r.alias.lower(): r.alias for r in relations}
        refs = set()
        for column in node.find_all(exp.Column):
            if isinstance(column.this, exp.Star):
                continue
            nested = self._nested_select(column, node)
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

    @staticmethod
    def _nested_select(column: exp.Expression, node: exp.Expression) -> exp.Select | None:
        """The innermost SELECT between the column and the node (a subquery reading it), or None."""
        for parent in (column, *ancestors(column)):
            if parent is node:
                return None
            if isinstance(parent, exp.Select):
                return parent
        return None

    def _conditions(self, relations: list[Relation]) -> list[Condition]:
        where = self.select.args.get("where")
        terms = [(t, None) for t in conjuncts(where.this if where else None)]
        for join, relation in zip(self.select.args.get("joins") or [], relations[1:]):
            terms += [(t, relation) for t in conjuncts(join.args.get("on"))]
        out = []
        for term, joined in terms:
            call = bind(term) if ai_name(term) else None
            if call is not None and call.kind != "filter":
                call = None
            on = joined.alias if joined is not None else None
            out.append(Condition(term, self._refs(term, relations), call, on,
                                 on if joined is not None and joined.side else None))
        return out

    @staticmethod
    def _late_where(relations: list[Relation]) -> bool:
        """Whether WHERE waits for every join: a RIGHT or FULL join may NULL-extend tables joined before it."""
        return any(r.side in ("RIGHT", "FULL") for r in relations)

    # -- planning --------------------------------------------------------------------------

    def plan(self) -> list[Step]:
        relations = self._relations()
        conditions = self._conditions(relations)
        values = self._ai_values(relations, conditions)
        limit = self._model_limit() if len(relations) == 1 else None
        for relation in relations:
            self._core(relation, relations, conditions, values, limit)
        pending = list(conditions)
        late = self._late_where(relations)
        after = [c for c in pending if c.call is None and (len(c.refs) > 1 and contains_ai(c.node)
                                                           or late and c.on is None)]
        pending = [c for c in pending if c not in after]
        if len(relations) == 1:
            source = exp.From(this=_table(relations[0].core, relations[0].alias))
            joins = []
        else:
            orders, pick = self._orders(relations, pending)
            tuples = (self._join(relations, pending, orders[0]) if pick is None
                      else self._join_choice(relations, pending, orders, pick))
            for node in list(ai_calls(self.select)):
                if id(node) in values and len(values[id(node)][0]) > 1:
                    refs, call = values[id(node)]
                    column = self._name("ai")
                    tuples = self._ai_value(tuples, relations, refs, call, column)
                    node.replace(self._value_ref(TUPLES, column, call, node))
                    self.tuple_columns.append(column)
            source = exp.From(this=_table(tuples, TUPLES))
            joins = [exp.Join(this=_table(r.core, r.alias), side="LEFT" if r.outer else None,
                              on=exp.EQ(this=_col(r.alias, ROW_ID), expression=_col(TUPLES, self._slot(i))))
                     for i, r in enumerate(relations)]
        final = self.select.copy()
        final.set("from_", source)
        final.set("joins", joins or None)
        final.set("where", exp.Where(this=_and([c.node for c in after])) if after else None)
        self._hide_internal_columns(final, relations)
        self.steps.append(SQLStep(final.sql("duckdb"), self.result))
        return self.steps

    def _ai_values(self, relations: list[Relation], conditions: list[Condition]) -> dict[int, tuple[frozenset, AICall]]:
        """AI calls that are values (not top-level filter conditions), replaced in the tree by columns.

        Returns id(call node) → (the relations it names, bound call): a value naming
        one relation is computed on its core, one naming several on the joined tuples.
        """
        filters = {id(c.node) for c in conditions if c.call is not None}
        values: dict[int, tuple[frozenset, AICall]] = {}
        for node in ai_calls(self.select):
            if any(ai_name(a) for a in ancestors(node)):
                raise InvalidArgument(f"AI functions cannot be nested{position(node)}")
            if id(node) in filters:
                continue
            if any(isinstance(n, exp.AggFunc) for n in node.walk()):
                raise InvalidArgument(f"an AI function over aggregates is not supported yet: compute them in a "
                                      f"subquery and ask about its columns{position(node)}")
            values[id(node)] = (self._refs(node, relations) or frozenset({relations[0].alias}), bind(node))
        return values

    def _slot(self, index: int) -> str:
        return f"{TUPLES}_{index}"

    def _model_limit(self) -> int | None:
        """LIMIT n [OFFSET m] as n + m when the first rows passing the filters are the answer.

        That holds for a plain projection of one table: no ordering, grouping,
        DISTINCT, aggregates or window functions. The model then sees rows only
        until that many have passed (in table order).
        """
        select = self.select
        limit, offset = select.args.get("limit"), select.args.get("offset")
        if limit is None or any(select.args.get(k) for k in ("order", "group", "having", "distinct", "qualify")):
            return None
        if any(isinstance(n, (exp.AggFunc, exp.Window)) for item in select.expressions for n in item.walk()):
            return None
        count, skip = limit.expression, offset.expression if offset is not None else exp.Literal.number(0)
        if not (isinstance(count, exp.Literal) and isinstance(skip, exp.Literal)) or count.is_string or skip.is_string:
            return None
        rows = int(count.this) + int(skip.this)
        return rows if rows < UNLIMITED else None

    def _core(self, relation: Relation, relations: list[Relation], conditions: list[Condition],
              values: dict[int, tuple[frozenset, AICall]], limit: int | None) -> None:
        """Steps computing this table's rows that pass every condition on it alone.

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
        deferred = [c.node for c in local if c.call is None and contains_ai(c.node)]
        plain = [c.node for c in local if c.call is None and not contains_ai(c.node)]
        asks = [(call, "filter", "") for call in by_rank([c.call for c in local if c.call is not None])]
        stored = self.catalog.rows(relation.table.name)
        relation.rows = (UNKNOWN_ROWS if stored is None else stored) * PLAIN_SELECTIVITY ** len(plain) \
            * math.prod(call.selectivity or DEFAULT_SELECTIVITY for call, _, _ in asks)
        for node in list(ai_calls(self.select)):
            if id(node) in values and values[id(node)][0] == {alias}:
                column = self._name("ai")
                call = values[id(node)][1]
                asks.append((call, "bool" if call.kind == "filter" else call.kind, column))
                node.replace(self._value_ref(alias, column, call, node))
                relation.ai_columns.append(column)

        args: list[tuple[str, ...]] = []
        projection: list[exp.Expression] = [exp.Column(this=exp.Star(), table=_ident(alias)),
                                             exp.alias_(exp.Window(this=exp.RowNumber()), ROW_ID, quoted=True)]
        for k, (call, _, _) in enumerate(asks):
            names = tuple(f"__quail_arg_{self.names.count}_{k}_{j}" for j in range(len(call.args)))
            args.append(names)
            projection += [exp.alias_(exp.cast(a.copy(), exp.DataType.build("VARCHAR")), n, quoted=True)
                           for a, n in zip(call.args, names)]
        current = self._name(f"rows_{alias}")
        query = exp.select(*projection).from_(relation.table.copy())
        if plain:
            query = query.where(_and(plain))
        self.steps.append(SQLStep(query.sql("duckdb"), current))
        steps = []
        for (call, kind, column), names in zip(asks, args):
            output = self._name("ai")
            steps.append(AIStep(current, output, kind, call.template, names, "filter", call.labels,
                                column, call.selectivity or DEFAULT_SELECTIVITY, call.anchor, call.answers))
            current = output
        filters = [s for s in steps if s.kind == "filter"]
        if (limit is not None and filters and not deferred) or len(filters) > 1:
            chain = AIFilterChain(filters[0].input, filters[-1].output, tuple(filters),
                                  limit if not deferred else None)
            steps = [chain] + steps[len(filters):]
        self.steps.extend(steps)
        if deferred:
            output = self._name(f"core_{alias}")
            query = exp.select(exp.Star()).from_(_table(current, alias)).where(_and(deferred))
            self.steps.append(SQLStep(query.sql("duckdb"), output))
            current = output
        relation.core = current

    def _value_ref(self, alias: str, column: str, call: AICall, node: exp.Expression) -> exp.Expression:
        """What stands for an AI value's column in the SELECT; in a grouped SELECT, outside an aggregate,
        any row's (its arguments are the group's keys: every row of the group asks the same)."""
        ref = _col(alias, column)
        if self._per_group(node):
            ref = exp.AnyValue(this=ref)
        if call.name == "AI_CLASSIFY":
            label_list = exp.Array(expressions=[ref])
            obj = exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier("labels"), expression=label_list)])
            return exp.Cast(this=exp.Anonymous(this="TO_JSON", expressions=[obj]), to=exp.DataType.build("JSON"))
        return ref

    def _per_group(self, node: exp.Expression) -> bool:
        """Whether an AI value is asked per row but read once per group: in a grouped SELECT, outside any
        aggregate, and not a grouping key itself (GROUP BY ALL groups by every such value). Its arguments
        must then be grouping keys, so every row of a group asks the same (InvalidArgument otherwise)."""
        group = self.select.args.get("group")
        if not _grouped(self.select) or any(isinstance(a, exp.AggFunc) for a in ancestors(node)) or (
                group is not None and group.args.get("all")):
            return False
        keys = _group_keys(self.select)
        if any(key == above for key in keys for above in (node, *ancestors(node))):
            return False
        _check_grouped(node, keys)
        return True

    def _orders(self, relations: list[Relation],
                pending: list[Condition]) -> tuple[list[list[int]], Callable[[list[int]], int] | None]:
        """The join orders worth keeping, best first, and how to pick among them by the cores' observed
        rows (None: the order is fixed: forced, or by outer joins). Kept: the cheapest of the Pareto orders
        (join_order.py), and the cheapest were one table's rows ten times more or fewer than estimated."""
        aliases = [r.alias.lower() for r in relations]
        if self.join_order is not None:
            forced = [a.lower() for a in self.join_order]
            if sorted(forced) != sorted(aliases):
                raise InvalidArgument(f"a forced join order must name each of {', '.join(aliases)} once")
            return [[aliases.index(a) for a in forced]], None
        if any(r.side for r in relations):
            return [list(range(len(relations)))], None
        sizes = [r.rows for r in relations]
        edges = [self._edge(c, relations) for c in pending if len(c.refs) > 1 and c.outer_on is None]
        pareto = sorted(pareto_orders(sizes, edges), key=lambda p: (self.rank(p[0]), p[1]))
        work, order = pareto[0]
        query_order = cost(list(range(len(relations))), sizes, edges)
        self.notes.append(f"join order {self._priced(order, work, relations)} (the query's order: "
                          f"{self._priced(list(range(len(relations))), query_order, relations)})")
        if len(pareto) > 1:
            self.notes.append("other join orders no plan beats on tokens, attention pairs, KV writes and reads: "
                              + "; ".join(self._priced(o, w, relations) for w, o in pareto[1:]))
        self.notes += [note for c in pending if c.call is not None and len(c.refs) == 2
                       for note in self._other_anchor(c.call, relations)]
        candidates = [order]
        for i, factor in itertools.product(range(len(sizes)), ROWS_MISESTIMATED):
            scenario = [size * factor if j == i else size for j, size in enumerate(sizes)]
            other = best_order(scenario, edges, self.rank)[0]
            if other not in candidates:
                candidates.append(other)
        if len(candidates) == 1:
            return candidates, None

        def pick(rows: list[int]) -> int:
            return min(range(len(candidates)), key=lambda k: (self.rank(cost(candidates[k], rows, edges)), k))

        return candidates, pick

    def _join_choice(self, relations: list[Relation], pending: list[Condition], orders: list[list[int]],
                     pick: Callable[[list[int]], int]) -> str:
        """Each order's join steps, ending in one relation; the executor runs the one `pick` chooses."""
        output = self._name("joined")
        alternatives = []
        for order in orders:
            start = len(self.steps)
            last = self._join(relations, list(pending), order)
            self.steps.append(SQLStep(exp.select(exp.Star()).from_(_table(last, TUPLES)).sql("duckdb"), output))
            alternatives.append(tuple(self.steps[start:]))
            del self.steps[start:]
        pending.clear()
        self.steps.append(JoinChoice(tuple(r.core for r in relations),
                                     tuple(tuple(relations[i].alias for i in o) for o in orders),
                                     tuple(alternatives), output, pick))
        return output

    def _priced(self, order: list[int], work: Work, relations: list[Relation]) -> str:
        """An order with its estimated model work and rank, as EXPLAIN shows it."""
        ranked = self.rank(work)
        price = "" if self.rank is by_tokens else f", ~{ranked:.3g} s at the speed of light"
        return (f"{', '.join(relations[i].alias for i in order)}: ~{work.tokens:,.0f} model tokens, "
                f"{work.pairs:,.0f} attention pairs, {work.kv_written:,.0f} KV rows written, "
                f"{work.kv_read:,.0f} read{price}")

    def _other_anchor(self, call: AICall, relations: list[Relation]) -> list[str]:
        """A note when anchoring another document of an AI join would ask the model less (the query decides)."""
        by_alias = {r.alias: r for r in relations}
        sides = [self._refs(arg, relations) for arg in call.args]
        if len(call.args) != 2 or any(len(side) != 1 for side in sides) or sides[0] == sides[1]:
            return []
        rows = [by_alias[next(iter(side))].rows for side in sides]
        tokens, question = self._prompt_tokens(call, relations)

        def asked(anchor: int) -> float:  # each anchor once, then the other document and question per pair
            return rows[anchor] * tokens[anchor] + rows[0] * rows[1] * (tokens[1 - anchor] + question)

        chosen, other = asked(call.anchor), asked(1 - call.anchor)
        if other >= chosen:
            return []
        return [f"AI join {call.template!r}: anchoring {{{1 - call.anchor}}} would ask ~{other:,.0f} model tokens "
                f"instead of ~{chosen:,.0f}; add {{'anchor': {1 - call.anchor}}} to choose it (the prompt changes)"]

    def _edge(self, condition: Condition, relations: list[Relation]) -> Edge:
        index = {r.alias: i for i, r in enumerate(relations)}
        refs = frozenset(index[a] for a in condition.refs)
        call = condition.call
        if call is None:
            return Edge(refs, PLAIN_SELECTIVITY)
        tokens, question = self._prompt_tokens(call, relations)
        anchor_refs = self._refs(call.args[call.anchor], relations)
        anchor = index[next(iter(anchor_refs))] if len(anchor_refs) == 1 else min(refs)
        rest = sum(tokens) - tokens[call.anchor] + question
        return Edge(refs, call.selectivity or DEFAULT_SELECTIVITY, True, anchor, tokens[call.anchor], rest)

    def _prompt_tokens(self, call: AICall, relations: list[Relation]) -> tuple[list[float], float]:
        """Estimated tokens of each PROMPT argument, and of the question with the prompt's frame."""
        return [self._tokens(arg, relations) for arg in call.args], len(call.template) / CHARS_PER_TOKEN + FRAME_TOKENS

    def _tokens(self, arg: exp.Expression, relations: list[Relation]) -> float:
        """Estimated tokens of a PROMPT argument: a column's mean length, else a short value."""
        if isinstance(arg, exp.Column) and not isinstance(arg.this, exp.Star):
            (alias,) = self._refs(arg, relations)
            relation = next(r for r in relations if r.alias == alias)
            chars = self.catalog.mean_chars(relation.table.name, arg.name)
            if chars is not None:
                return chars / CHARS_PER_TOKEN
        return SHORT_TOKENS

    def _join(self, relations: list[Relation], pending: list[Condition], order: list[int]) -> str:
        """Row-id tuples of the joins in `order`, each condition applied once its tables are joined.

        A LEFT, RIGHT or FULL join matches by its ON conditions, then adds the
        unmatched tuples before (LEFT, FULL) or its unmatched new rows (RIGHT,
        FULL) with NULL slots; WHERE conditions apply to the joined tuples after
        (after the last join when a RIGHT or FULL join may NULL-extend them).
        Slot i always holds relation i's row id, whatever the order.
        """
        first = relations[order[0]]
        current = self._name("tuples")
        self.steps.append(SQLStep(
            exp.select(exp.alias_(_col(first.alias, ROW_ID), self._slot(order[0]), quoted=True))
            .from_(_table(first.core, first.alias)).sql("duckdb"), current))
        late = self._late_where(relations)
        for k, i in enumerate(order[1:], start=1):
            new, bound = relations[i], {relations[j].alias for j in order[: k + 1]}
            where = [c for c in pending if c.outer_on is None and c.refs <= bound and not (late and c.on is None)]
            on = [c for c in pending if c.outer_on == new.alias]
            if new.side:
                matched = self._extend(current, relations, i, [c for c in on if c.call is None])
                matched = self._apply(matched, relations, [c for c in on if c.call is not None])
                current = self._outer(current, matched, relations, i, order[:k])
                if any(c.call is None for c in where):
                    current = self._filter(current, relations, [c for c in where if c.call is None])
            else:
                current = self._extend(current, relations, i, [c for c in where if c.call is None])
            current = self._apply(current, relations, [c for c in where if c.call is not None])
            for condition in on + where:
                pending.remove(condition)
        if late:
            last = [c for c in pending if c.on is None and c.call is not None]
            current = self._apply(current, relations, last)
            pending[:] = [c for c in pending if c not in last]
        if pending:
            raise InvalidArgument("a condition names tables the query does not join")
        return current

    def _apply(self, tuples: str, relations: list[Relation], conditions: list[Condition]) -> str:
        for condition in conditions:
            tuples = self._ai_join(tuples, relations, condition)
        return tuples

    def _outer(self, before: str, matched: str, relations: list[Relation], i: int, joined: list[int]) -> str:
        """An outer join's tuples: the matched ones, plus the unmatched tuples before with a NULL slot i
        (LEFT, FULL), plus relation i's unmatched rows with NULL slots before (RIGHT, FULL)."""
        new = relations[i]
        if new.side in ("LEFT", "FULL"):
            on = exp.and_(*(exp.NullSafeEQ(this=_col("__quail_m", self._slot(j)), expression=_col(TUPLES, self._slot(j)))
                            for j in joined))
            query = exp.select(exp.Column(this=exp.Star(), table=_ident(TUPLES)), _col("__quail_m", self._slot(i))) \
                .from_(_table(before, TUPLES)).join(_table(matched, "__quail_m"), on=on, join_type="LEFT")
        else:
            query = exp.select(exp.Star()).from_(_table(matched, TUPLES))
        if new.side in ("RIGHT", "FULL"):
            seen = exp.select("1").from_(_table(matched, "__quail_m")).where(
                exp.EQ(this=_col("__quail_m", self._slot(i)), expression=_col(new.alias, ROW_ID)))
            unmatched = exp.select(
                *(exp.alias_(exp.cast(exp.null(), exp.DataType.build("BIGINT")), self._slot(j), quoted=True)
                  for j in joined),
                exp.alias_(_col(new.alias, ROW_ID), self._slot(i), quoted=True),
            ).from_(_table(new.core, new.alias)).where(exp.not_(exp.Exists(this=seen)))
            query = exp.union(query, unmatched, distinct=False)
        output = self._name("tuples")
        self.steps.append(SQLStep(query.sql("duckdb"), output))
        return output

    def _filter(self, tuples: str, relations: list[Relation], plain: list[Condition]) -> str:
        """The tuples passing plain conditions over the relations joined so far."""
        names = set().union(*(c.refs for c in plain))
        query = exp.select(exp.Column(this=exp.Star(), table=_ident(TUPLES))).from_(_table(tuples, TUPLES))
        query = self._joined_to(query, relations, names).where(_and([c.node for c in plain]))
        output = self._name("tuples")
        self.steps.append(SQLStep(query.sql("duckdb"), output))
        return output

    def _joined_to(self, query: exp.Select, relations: list[Relation], aliases) -> exp.Select:
        """The query joined to the cores of the named relations (all joined already) by their slots."""
        for i, r in enumerate(relations):
            if r.alias in aliases:
                query = query.join(_table(r.core, r.alias), join_type="LEFT" if r.outer else None,
                                   on=exp.EQ(this=_col(r.alias, ROW_ID), expression=_col(TUPLES, self._slot(i))))
        return query

    def _extend(self, tuples: str, relations: list[Relation], i: int, plain: list[Condition]) -> str:
        new = relations[i]
        names = set().union(*(c.refs for c in plain)) if plain else set()
        query = exp.select(exp.Column(this=exp.Star(), table=_ident(TUPLES)),
                           exp.alias_(_col(new.alias, ROW_ID), self._slot(i), quoted=True)) \
            .from_(_table(tuples, TUPLES)).join(_table(new.core, new.alias), join_type="CROSS")
        query = self._joined_to(query, relations, names - {new.alias})
        if plain:
            query = query.where(_and([c.node for c in plain]))
        output = self._name("tuples")
        self.steps.append(SQLStep(query.sql("duckdb"), output))
        return output

    def _combos(self, tuples: str, relations: list[Relation], refs: frozenset, call: AICall) -> tuple[str, list[str], tuple[str, ...]]:
        """A relation of the distinct row combinations an AI call names, with its arguments as text.

        Returns its name, the tuple slots of the relations named, and the argument columns.
        """
        index = {r.alias: i for i, r in enumerate(relations)}
        slots = [self._slot(index[a]) for a in sorted(refs, key=index.get)]
        names = tuple(f"__quail_arg_{self.names.count}_{j}" for j in range(len(call.args)))
        query = exp.select(*(_col(TUPLES, s) for s in slots),
                           *(exp.alias_(exp.cast(a.copy(), exp.DataType.build("VARCHAR")), n, quoted=True)
                             for a, n in zip(call.args, names))).distinct().from_(_table(tuples, TUPLES))
        query = self._joined_to(query, relations, refs)
        combos = self._name("combos")
        self.steps.append(SQLStep(query.sql("duckdb"), combos))
        return combos, slots, names

    def _with_answers(self, tuples: str, answers: str, slots: list[str], join_type: str, extra: list) -> str:
        """The tuples joined to per-combination answers on the slots they share."""
        on = exp.and_(*(exp.EQ(this=_col("__quail_k", s), expression=_col(TUPLES, s)) for s in slots))
        output = self._name("tuples")
        self.steps.append(SQLStep(
            exp.select(exp.Column(this=exp.Star(), table=_ident(TUPLES)), *extra).from_(_table(tuples, TUPLES))
            .join(_table(answers, "__quail_k"), on=on, join_type=join_type).sql("duckdb"), output))
        return output

    def _ai_join(self, tuples: str, relations: list[Relation], condition: Condition) -> str:
        """Ask an AI condition once per distinct row combination it names; keep the tuples answered yes.

        A condition on one table (a WHERE waiting for a RIGHT or FULL join) keeps the filter layout.
        """
        call = condition.call
        combos, slots, names = self._combos(tuples, relations, condition.refs, call)
        kept = self._name("kept")
        layout = "join" if len(condition.refs) > 1 else "filter"
        self.steps.append(AIStep(combos, kept, "filter", call.template, names, layout, (), "",
                                 call.selectivity or DEFAULT_SELECTIVITY, call.anchor))
        return self._with_answers(tuples, kept, slots, "INNER", [])

    def _ai_value(self, tuples: str, relations: list[Relation], refs: frozenset, call: AICall, column: str) -> str:
        """An AI value over several tables, asked once per distinct row combination: a column of the tuples."""
        combos, slots, names = self._combos(tuples, relations, refs, call)
        answered = self._name("answered")
        self.steps.append(AIStep(combos, answered, "bool" if call.kind == "filter" else call.kind, call.template,
                                 names, "join", call.labels, column, call.selectivity or DEFAULT_SELECTIVITY,
                                 call.anchor, call.answers))
        return self._with_answers(tuples, answered, slots, "LEFT", [_col("__quail_k", column)])

    def _hide_internal_columns(self, final: exp.Select, relations: list[Relation]) -> None:
        """Stars of the final projection leave out row ids, tuple slots and AI value columns."""
        every = [ROW_ID] + [c for r in relations for c in r.ai_columns]
        if len(relations) > 1:
            every += [self._slot(i) for i in range(len(relations))] + self.tuple_columns
        by_alias = {r.alias.lower(): r for r in relations}
        for item in final.expressions:
            star = item if isinstance(item, exp.Star) else item.this if (
                isinstance(item, exp.Column) and isinstance(item.this, exp.Star)) else None
            if star is None:
                continue
            if isinstance(item, exp.Column):
                relation = by_alias.get(item.table.lower())
                hidden = [ROW_ID] + (relation.ai_columns if relation else [])
            else:
                hidden = every
            star.set("except_", [exp.column(_ident(h)) for h in hidden])
