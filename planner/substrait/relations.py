"""SQL queries (sqlglot trees, DuckDB dialect) as Substrait relation trees."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from sqlglot import exp
from substrait.algebra_pb2 import AggregateRel, CrossRel, FetchRel, FilterRel, JoinRel, ProjectRel, Rel, RelCommon, \
    SetRel, SortField, SortRel

from quail.engine.errors import InvalidArgument, NotFound, Unimplemented

from quail.planner.substrait.expressions import (AGGREGATES, Column, Expressions, Relation, Scope, Typed, field_ref,
                                                literal, sort_field)
from quail.planner.substrait.types import describe, same

Sources = Callable[[str], "Relation | None"]  # a stored table or an earlier step's output, by name
Ctes = dict[str, tuple[exp.Expression, "Ctes", list[str]]]  # name: (body, the CTEs it sees, column aliases)
_SELECT_CLAUSES = {"expressions", "from_", "joins", "where", "group", "having", "order", "limit", "offset", "distinct",
                   "with_"}
_OWN_SCOPES = (exp.Window, exp.Subquery, exp.Select)  # aggregates inside them are not the query's
_JOINS = {"": JoinRel.JOIN_TYPE_INNER, "LEFT": JoinRel.JOIN_TYPE_LEFT, "RIGHT": JoinRel.JOIN_TYPE_RIGHT,
          "FULL": JoinRel.JOIN_TYPE_OUTER}


@dataclass(frozen=True)
class _Env:
    """What a query's names resolve in besides its FROM clause: the CTEs it sees and, for a subquery inside an
    expression, the scope of that expression (the columns it may correlate with)."""

    ctes: Ctes
    outer: Scope | None = None

    def scope(self, columns: list[Column]) -> Scope:
        return Scope(columns, outer=self.outer, ctes=self.ctes)


@dataclass(frozen=True)
class _Item:
    """An entry of a SELECT list: an expression or, from a star, a column position; and its name."""

    node: exp.Expression | None
    position: int | None
    name: str


def common(rel: Rel) -> RelCommon:
    """The common properties (emit, hint) of a relation that has them (any but a ReferenceRel)."""
    return getattr(rel, rel.WhichOneof("rel_type")).common


def with_common(rel: Rel) -> Rel:
    """The relation itself, or a ReferenceRel inside a ProjectRel of no expressions (to carry an emit or hint)."""
    return Rel(project=ProjectRel(input=rel)) if rel.HasField("reference") else rel


def emitted(relation: Relation, outputs: list[int], columns: list[Column]) -> Relation:
    """The relation's columns at `outputs` (an emit, composed with one it has), named as `columns`."""
    if outputs == list(range(len(relation.columns))):
        return Relation(relation.rel, columns)
    rel = with_common(relation.rel)
    emit = common(rel).emit
    mapping = [emit.output_mapping[i] for i in outputs] if common(rel).HasField("emit") else outputs
    del emit.output_mapping[:]
    emit.output_mapping.extend(mapping)
    return Relation(rel, columns)


def _count(clause: exp.Expression, what: str) -> int:
    value = clause.expression
    if not (isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit()):
        raise Unimplemented(f"Substrait export: {what} must be a whole number, not {value.sql('duckdb')}")
    return int(value.this)


class Queries:
    """Translates queries to Substrait relation trees.

    Translates queries to relation trees over the named relations `sources` finds: FROM and joins
    (ReadRel / ReferenceRel, JoinRel, CrossRel), WHERE and HAVING (FilterRel), GROUP BY, aggregates and
    DISTINCT (AggregateRel), the SELECT list (ProjectRel and emit), ORDER BY (SortRel), LIMIT / OFFSET
    (FetchRel), UNION [ALL] (SetRel); CTEs and derived tables inline, subqueries in expressions."""

    def __init__(self, expressions: Expressions, sources: Sources) -> None:
        self.expressions = expressions
        self.sources = sources
        expressions.subquery = self._subquery

    def query(self, node: exp.Expression, env: _Env | None = None) -> Relation:
        env = self._with(node, env or _Env({}))
        if isinstance(node, exp.Select):
            return self._select(node, env)
        if type(node) is exp.Union:
            return self._union(node, env)
        if isinstance(node, exp.Subquery):
            return self.query(node.this, env)
        raise Unimplemented(f"Substrait export: {node.key.upper()} queries are not supported")

    def _subquery(self, node: exp.Expression, scope: Scope) -> Relation:
        """A subquery inside an expression over `scope` (whose columns it may read: outer references)."""
        return self.query(node, _Env(scope.ctes, scope))

    @staticmethod
    def _with(node: exp.Expression, env: _Env) -> _Env:
        with_ = node.args.get("with_")
        if not with_:
            return env
        if with_.args.get("recursive"):
            raise Unimplemented("Substrait export: WITH RECURSIVE is not supported")
        seen = dict(env.ctes)
        for cte in with_.expressions:
            alias = cte.args.get("alias")
            seen[cte.alias_or_name.lower()] = (cte.this, dict(seen), [c.name for c in alias.columns] if alias else [])
        return replace(env, ctes=seen)

    def _select(self, node: exp.Select, env: _Env) -> Relation:
        extra = [k for k, v in node.args.items() if v and k not in _SELECT_CLAUSES]
        if extra:
            raise Unimplemented(f"Substrait export: the {extra[0].rstrip('_').upper()} clause is not supported")
        distinct = node.args.get("distinct")
        if distinct is not None and distinct.args.get("on"):
            raise Unimplemented("Substrait export: DISTINCT ON is not supported")
        source = self._from(node, env)
        where = node.args.get("where")
        if where is not None:
            source = self._filter(source, where.this, env.scope(source.columns))
        items = self._items(node, env.scope(source.columns))
        source, scope = self._group(node, items, source, env)
        having = node.args.get("having")
        if having is not None:
            source = self._filter(source, having.this, scope)
        projected, outputs = self._project(source, items, scope)
        columns = [Column(None, item.name, projected.columns[o].type) for item, o in zip(items, outputs)]
        if distinct is not None:
            projected, outputs = self._distinct(emitted(projected, outputs, columns)), list(range(len(items)))
        ordered = self._order_and_fetch(projected, node, items, outputs, scope, only_outputs=distinct is not None)
        return emitted(ordered, outputs, columns)

    def _union(self, node: exp.Union, env: _Env) -> Relation:
        if node.args.get("by_name"):
            raise Unimplemented("Substrait export: UNION BY NAME is not supported")
        left, right = self.query(node.this, env), self.query(node.expression, env)
        if len(left.columns) != len(right.columns):
            raise InvalidArgument("Substrait export: the queries of a UNION give different numbers of columns")
        for a, b in zip(left.columns, right.columns):
            if not same(a.type, b.type):
                raise Unimplemented(f"Substrait export: UNION of {describe(a.type)} and {describe(b.type)} columns "
                                    f"needs an explicit CAST")
        op = SetRel.SET_OP_UNION_DISTINCT if node.args.get("distinct") else SetRel.SET_OP_UNION_ALL
        union = Relation(Rel(set=SetRel(inputs=[left.rel, right.rel], op=op)),
                         [replace(c, qualifier=None) for c in left.columns])
        items = [_Item(None, i, c.name) for i, c in enumerate(union.columns)]
        outputs = list(range(len(items)))
        return self._order_and_fetch(union, node, items, outputs, env.scope(union.columns), only_outputs=False)

    def _from(self, node: exp.Select, env: _Env) -> Relation:
        from_ = node.args.get("from_")
        if from_ is None:
            raise Unimplemented("Substrait export: a SELECT without FROM is not supported")
        relation = self._source(from_.this, env)
        for join in node.args.get("joins") or []:
            relation = self._join(relation, join, env)
        return relation

    def _source(self, node: exp.Expression, env: _Env) -> Relation:
        alias = node.args.get("alias")
        names = [c.name for c in alias.columns] if alias else []
        if isinstance(node, exp.Subquery):
            return self.query(node.this, env).qualified(node.alias_or_name or None, names)
        if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
            raise Unimplemented(f"Substrait export: {node.sql('duckdb')[:60]} in FROM is not supported")
        cte = env.ctes.get(node.name.lower()) if not node.db else None
        if cte is not None:
            body, seen, columns = cte
            relation = self.query(body, _Env(seen, env.outer)).qualified(None, columns)
        else:
            relation = self.sources(node.name)
            if relation is None:
                raise NotFound(f"Substrait export: table {node.name!r} does not exist")
        return relation.qualified(node.alias_or_name, names)

    def _join(self, left: Relation, join: exp.Join, env: _Env) -> Relation:
        if join.args.get("using") or join.method or join.kind not in ("", "INNER", "OUTER", "CROSS"):
            raise Unimplemented(f"Substrait export: {join.sql('duckdb').split(' ON ')[0].strip()} is not supported")
        right = self._source(join.this, env)
        columns = left.columns + right.columns
        on = join.args.get("on")
        if join.kind == "CROSS" or (on is None and not join.side):
            return Relation(Rel(cross=CrossRel(left=left.rel, right=right.rel)), columns)
        condition = self.expressions.condition(on, env.scope(columns)) if on is not None else literal("boolean", True)
        rel = JoinRel(left=left.rel, right=right.rel, expression=condition.expression, type=_JOINS[join.side])
        return Relation(Rel(join=rel), columns)

    def _filter(self, source: Relation, condition: exp.Expression, scope: Scope) -> Relation:
        kept = self.expressions.condition(condition, scope)
        return Relation(Rel(filter=FilterRel(input=source.rel, condition=kept.expression)), source.columns)

    def _items(self, node: exp.Select, scope: Scope) -> list[_Item]:
        """The SELECT list, stars expanded to the columns they name (less EXCLUDE's)."""
        items = []
        for entry in node.expressions:
            star = entry if isinstance(entry, exp.Star) else entry.this if (
                isinstance(entry, exp.Column) and isinstance(entry.this, exp.Star)) else None
            if star is None:
                items.append(_Item(entry.unalias(), None, _name(entry)))
                continue
            if star.args.get("replace") or star.args.get("rename"):
                raise Unimplemented("Substrait export: * REPLACE / RENAME is not supported")
            table = entry.table.lower() if isinstance(entry, exp.Column) else ""
            excluded = {c.name.lower() for c in star.args.get("except_") or []}
            named = [_Item(None, i, c.name) for i, c in enumerate(scope.columns)
                     if (not table or (c.qualifier or "").lower() == table) and c.name.lower() not in excluded]
            if table and not any((c.qualifier or "").lower() == table for c in scope.columns):
                raise InvalidArgument(f"Substrait export: no table {entry.table!r} for {entry.sql('duckdb')}")
            items += named
        return items

    def _aggregates(self, node: exp.Select, items: list[_Item], scope: Scope) -> dict[str, exp.AggFunc]:
        """The aggregate calls of the SELECT list, HAVING and ORDER BY, by their key (one each)."""
        having, order = node.args.get("having"), node.args.get("order")
        roots = [i.node for i in items if i.node is not None] + ([having.this] if having else [])
        roots += [o.this for o in order.expressions] if order else []
        found: dict[str, exp.AggFunc] = {}
        for root in roots:
            for n in root.walk(prune=lambda n: type(n) in AGGREGATES or isinstance(n, _OWN_SCOPES)):
                if type(n) in AGGREGATES:
                    found.setdefault(scope.key(n), n)
        return found

    def _group(self, node: exp.Select, items: list[_Item], source: Relation, env: _Env) -> tuple[Relation, Scope]:
        """GROUP BY and aggregates as an AggregateRel (its keys, then its measures), and the scope after it."""
        scope = env.scope(source.columns)
        aggregates = self._aggregates(node, items, scope)
        group = node.args.get("group")
        if group is None and not aggregates:
            return source, scope
        if group is not None and any(group.args.get(k) for k in ("grouping_sets", "cube", "rollup", "totals", "all")):
            raise Unimplemented("Substrait export: GROUPING SETS, ROLLUP, CUBE and GROUP BY ALL are not supported")
        chosen = [self._group_key(e, items, scope) for e in (group.expressions if group else [])]
        keys = {scope.key(k): k for k in chosen}
        grouping = [self.expressions.translate(k, scope) for k in keys.values()]
        measures = [self.expressions.aggregate(a, scope) for a in aggregates.values()]
        rel = AggregateRel(input=source.rel, grouping_expressions=[g.expression for g in grouping],
                           measures=[AggregateRel.Measure(measure=m) for m, _ in measures])
        if grouping:
            rel.groupings.add(expression_references=range(len(grouping)))
        columns = [source.columns[g.field] if g.field is not None else Column(None, k.sql("duckdb"), g.type)
                   for g, k in zip(grouping, keys.values())]
        columns += [Column(None, a.sql("duckdb"), t) for a, (_, t) in zip(aggregates.values(), measures)]
        computed = {key: i for i, key in enumerate([*keys, *aggregates])}
        return Relation(Rel(aggregate=rel), columns), replace(scope, columns=columns, computed=computed, before=scope)

    @staticmethod
    def _group_key(node: exp.Expression, items: list[_Item], scope: Scope) -> exp.Expression:
        """A GROUP BY entry: a position or an output alias names a SELECT list expression."""
        if isinstance(node, exp.Literal) and not node.is_string:
            chosen = items[_position(node, len(items), "GROUP BY")]
        elif isinstance(node, exp.Column) and not node.table and scope.find(node) is None:
            chosen = next((i for i in items if i.name.lower() == node.name.lower()), _Item(node, None, ""))
        else:
            return node
        if chosen.node is None:
            raise Unimplemented("Substrait export: GROUP BY the position of a star's column is not supported")
        return chosen.node

    def _project(self, source: Relation, items: list[_Item], scope: Scope) -> tuple[Relation, list[int]]:
        """A ProjectRel appending the computed expressions (none: the source); each item's output position."""
        computed: list[tuple[_Item, Typed]] = []
        outputs = []
        for item in items:
            if item.position is not None:
                position = scope.computed.get(f"#{item.position}") if scope.computed else item.position
                if position is None:
                    raise InvalidArgument(f"Substrait export: column {item.name!r} of * is not a GROUP BY key")
                outputs.append(position)
                continue
            value = self.expressions.translate(item.node, scope)
            if value.field is None:
                computed.append((item, value))
            outputs.append(value.field if value.field is not None else len(source.columns) + len(computed) - 1)
        if not computed:
            return source, outputs
        rel = Rel(project=ProjectRel(input=source.rel, expressions=[v.expression for _, v in computed]))
        return Relation(rel, source.columns + [Column(None, i.name, v.type) for i, v in computed]), outputs

    @staticmethod
    def _distinct(relation: Relation) -> Relation:
        keys = range(len(relation.columns))
        rel = AggregateRel(input=relation.rel, grouping_expressions=[field_ref(i) for i in keys],
                           groupings=[AggregateRel.Grouping(expression_references=keys)])
        return Relation(Rel(aggregate=rel), relation.columns)

    def _order_and_fetch(self, relation: Relation, node: exp.Query, items: list[_Item], outputs: list[int],
                         scope: Scope, only_outputs: bool) -> Relation:
        """ORDER BY as a SortRel, then LIMIT / OFFSET as a FetchRel."""
        rel = relation.rel
        order = node.args.get("order")
        if order is not None:
            sorts = [self._sort_key(o, items, outputs, relation, scope, only_outputs) for o in order.expressions]
            rel = Rel(sort=SortRel(input=rel, sorts=sorts))
        limit, offset = node.args.get("limit"), node.args.get("offset")
        if limit is not None or offset is not None:
            fetch = FetchRel(input=rel)
            if limit is not None:
                fetch.count_expr.CopyFrom(literal("i64", _count(limit, "LIMIT")).expression)
            if offset is not None:
                fetch.offset_expr.CopyFrom(literal("i64", _count(offset, "OFFSET")).expression)
            rel = Rel(fetch=fetch)
        return Relation(rel, relation.columns)

    def _sort_key(self, ordered: exp.Ordered, items: list[_Item], outputs: list[int], relation: Relation,
                  scope: Scope, only_outputs: bool) -> SortField:
        """An ORDER BY key: a position, an output name, a selected expression, or (but after DISTINCT) any other."""
        node, keyed = ordered.this, scope.before or scope
        if isinstance(node, exp.Literal) and not node.is_string:
            chosen = _position(node, len(items), "ORDER BY")
        elif isinstance(node, exp.Column) and not node.table and any(_named(i, node) for i in items):
            chosen = next(k for k, i in enumerate(items) if _named(i, node))
        else:
            key = keyed.key(node)
            chosen = next((k for k, i in enumerate(items) if i.node is not None and keyed.key(i.node) == key), None)
        if chosen is not None:
            position = outputs[chosen]
            return sort_field(Typed(field_ref(position), relation.columns[position].type), ordered)
        if only_outputs:
            raise InvalidArgument("Substrait export: with DISTINCT, ORDER BY names selected columns only")
        return sort_field(self.expressions.translate(node, scope), ordered)


def _named(item: _Item, column: exp.Column) -> bool:
    return item.name.lower() == column.name.lower()


def _name(entry: exp.Expression) -> str:
    """A SELECT list entry's name, as far as ORDER BY and GROUP BY may use it: its alias or column name."""
    if isinstance(entry, (exp.Alias, exp.Column)):
        return entry.alias_or_name
    return entry.sql("duckdb")


def _position(node: exp.Literal, count: int, clause: str) -> int:
    if not node.this.isdigit() or not 1 <= int(node.this) <= count:
        raise InvalidArgument(f"Substrait export: {clause} {node.this} is not a position of the SELECT list")
    return int(node.this) - 1
