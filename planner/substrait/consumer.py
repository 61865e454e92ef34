"""A Substrait plan as one SQL query, planned as a query's text is: the same binding, rules, steps and errors.

- Each relation becomes a SELECT over its input's. A filter, columns, a sort or an aggregate over a plain
  SELECT (no grouping, order or limit; no window, aggregate or AI call among its columns) extends that
  SELECT itself, a limit any SELECT without one: the planner sees a query's conditions and AI calls together.
- A plan relation that a ReferenceRel reads becomes a CTE; the root's names are the final SELECT's columns.
- Quail's AI functions become its SQL calls (to_sql.py): the planner binds them, applies its rules
  (planner/rules/) and emits their steps. A call's layout is advisory: the planner asks in the join layout
  when the documents come from two tables, else in the filter layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Callable

from google.protobuf.message import DecodeError, Message
from sqlglot import exp
from substrait.algebra_pb2 import (AggregateRel, CrossRel, Expression, FetchRel, FilterRel, JoinRel, ProjectRel,
                                   ReadRel, Rel, RelCommon, SetRel, SortRel)
from substrait.plan_pb2 import Plan
from substrait.type_pb2 import Type

from quail.engine.errors import InvalidArgument, NotFound, Unimplemented
from quail.engine.exec.catalog import Catalog
from quail.engine.exec.plan import PhysicalPlan
from quail.engine.runtime.requests import ResidentShare

from quail.planner.ai_calls import contains_ai
from quail.planner.binder import CATALOG_NAME, SCHEMA_NAME
from quail.planner.join_order import Rank, by_tokens
from quail.planner.planner import plan_query
from quail.planner.substrait.expressions import field_position
from quail.planner.substrait.functions import declared_functions
from quail.planner.substrait.to_sql import Field, SQLExpressions
from quail.planner.substrait.types import from_arrow

QUERY_TEXT = "<Substrait plan>"  # a Substrait plan's query text where queries are listed
_JOIN_SIDES = {JoinRel.JOIN_TYPE_INNER: None, JoinRel.JOIN_TYPE_LEFT: "LEFT", JoinRel.JOIN_TYPE_RIGHT: "RIGHT",
               JoinRel.JOIN_TYPE_OUTER: "FULL"}
_SET_OPS = {SetRel.SET_OP_UNION_ALL: False, SetRel.SET_OP_UNION_DISTINCT: True}
_CLAUSES = ("group", "having", "qualify", "order", "limit", "offset", "distinct")  # a SELECT with one is not plain


def parse_plan(data: bytes) -> Plan:
    """A serialized Substrait plan; InvalidArgument when the bytes are none."""
    plan = Plan()
    try:
        plan.ParseFromString(data)
    except DecodeError as err:
        raise InvalidArgument(f"not a serialized Substrait plan: {err}") from None
    if not plan.relations:
        raise InvalidArgument("not a Substrait plan: it holds no relations")
    return plan


def import_plan(data: bytes, catalog: Catalog, rank: Rank = by_tokens,
                resident: ResidentShare | None = None) -> PhysicalPlan:
    """The physical plan of a serialized Substrait plan over the catalog's tables: its query planned as SQL
    (`rank`, `resident`: as plan_query's, so a server prices it as it prices a statement's text)."""
    return plan_query(_Importer(parse_plan(data), catalog).query(), catalog, rank=rank, resident=resident)


@dataclass(frozen=True)
class Rows:
    """A relation as SQL, with its columns' names and types.

    A named relation (a stored table, a CTE) or a SELECT with one aliased expression per column."""

    names: list[str]
    types: list[Type]
    query: exp.Select | None = None
    name: str | None = None

    def source(self, alias: str) -> exp.Expression:
        table_alias = exp.TableAlias(this=_ident(alias))
        if self.name is not None:
            return exp.Table(this=_ident(self.name), alias=table_alias)
        return exp.Subquery(this=self.query, alias=table_alias)

    def fields(self, alias: str) -> list[Field]:
        return [Field(exp.Column(this=_ident(n), table=_ident(alias)), t) for n, t in zip(self.names, self.types)]

    def select_all(self, alias: str) -> exp.Select:
        return _select(self.fields(alias), self.names).from_(self.source(alias))


def _ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def _select(fields: list[Field], names: list[str]) -> exp.Select:
    return exp.select(*_aliased(fields, names))


def _aliased(fields: list[Field], names: list[str]) -> list[exp.Expression]:
    return [exp.alias_(f.sql, _ident(n)) for f, n in zip(fields, names)]


def _plain(query: exp.Select) -> bool:
    """Whether a relation over the SELECT may extend it (a WHERE, columns, an ORDER BY, a GROUP BY) reading its
    columns' expressions in place of the columns: no clause acts after its WHERE, no column is a window, an
    aggregate or an AI call (which reading it twice would ask twice)."""
    return not any(query.args.get(k) for k in _CLAUSES) and not any(
        isinstance(n, (exp.Window, exp.AggFunc)) for e in query.expressions for n in e.walk()) and not any(
        contains_ai(e) for e in query.expressions)


def _unique(names: list[str]) -> list[str]:
    """The names, a repeated one suffixed _1, _2, ... (DuckDB's way)."""
    seen: set[str] = set()
    out = []
    for name in names:
        candidate, n = name, 0
        while candidate.lower() in seen:
            n += 1
            candidate = f"{name}_{n}"
        seen.add(candidate.lower())
        out.append(candidate)
    return out


class _Importer:
    """Lowers a plan's root relation to one SELECT, the plan relations it reads (ReferenceRels) its CTEs."""

    def __init__(self, plan: Plan, catalog: Catalog) -> None:
        self.plan = plan
        self.catalog = catalog
        self.sql = SQLExpressions(declared_functions(plan), self._subquery)
        self.ctes: list[tuple[str, exp.Select]] = []
        self.done: dict[int, Rows] = {}
        self.active: set[int] = set()
        self.aliases = 0
        self._rels: dict[str, Callable[[Message], Rows]] = {
            "read": self._read, "reference": lambda r: self._plan_rel(r.subtree_ordinal), "filter": self._filter,
            "project": self._project, "join": self._join, "cross": self._cross, "aggregate": self._aggregate,
            "sort": self._sort, "fetch": self._fetch, "set": self._set,
        }

    def query(self) -> exp.Select:
        """The root relation as a SELECT naming its columns as the root does, the plan relations it reads
        before it as CTEs."""
        roots = [r.root for r in self.plan.relations if r.WhichOneof("rel_type") == "root"]
        if len(roots) != 1:
            raise InvalidArgument(f"a Substrait plan needs one root relation, this one has {len(roots)}")
        (root,) = roots
        rows = self.rel(root.input)
        names = list(root.names)
        if len(names) != len(rows.names):
            raise InvalidArgument(f"the plan's root names {len(names)} columns; its relation gives {len(rows.names)}")
        query = rows.query.copy() if rows.query is not None else rows.select_all(self._alias())
        query.set("expressions", [exp.alias_(e.unalias(), _ident(n)) for e, n in zip(query.expressions, names)])
        for name, body in self.ctes:
            query = query.with_(_ident(name), as_=body, copy=False)
        return query

    def _alias(self) -> str:
        """A fresh name for a derived table or a CTE (never a stored table's)."""
        self.aliases += 1
        while self.catalog.has(f"__s{self.aliases}"):
            self.aliases += 1
        return f"__s{self.aliases}"

    def _open(self, rows: Rows) -> tuple[exp.Select, list[Field]]:
        """A SELECT of the rows that a relation over them may extend, and its columns as that relation reads
        them: the rows' own SELECT when it is plain (its columns' expressions), else one reading the rows."""
        query = rows.query.copy() if rows.query is not None and _plain(rows.query) else rows.select_all(self._alias())
        return query, [Field(e.unalias(), t) for e, t in zip(query.expressions, rows.types)]

    def _emitted(self, rows: Rows, common: RelCommon) -> Rows:
        """The columns a relation's emit chooses."""
        width = len(rows.names)
        mapping = list(common.emit.output_mapping) if common.HasField("emit") else list(range(width))
        if any(not 0 <= i < width for i in mapping):
            raise InvalidArgument(f"an emit names a field beyond the {width} of its relation")
        if mapping == list(range(width)):
            return rows
        query = rows.query.copy() if rows.query is not None else rows.select_all(self._alias())
        names = _unique([rows.names[i] for i in mapping])
        query.set("expressions", [exp.alias_(query.expressions[i].unalias().copy(), _ident(n))
                                  for i, n in zip(mapping, names)])
        return Rows(names, [rows.types[i] for i in mapping], query)

    def _subquery(self, rel: Rel) -> tuple[exp.Select, list[Type]]:
        """A subquery expression's relation as one SELECT (it may read the enclosing query's columns)."""
        rows = self.rel(rel)
        return (rows.query if rows.query is not None else rows.select_all(self._alias())), rows.types

    def _plan_rel(self, ordinal: int) -> Rows:
        """The CTE computing a plan relation that a ReferenceRel reads."""
        if ordinal in self.done:
            return self.done[ordinal]
        if not 0 <= ordinal < len(self.plan.relations) or self.plan.relations[ordinal].WhichOneof("rel_type") != "rel":
            raise InvalidArgument(f"a ReferenceRel reads plan relation {ordinal}, which is no (non-root) relation")
        if ordinal in self.active:
            raise InvalidArgument(f"plan relation {ordinal} references itself")
        self.active.add(ordinal)
        rows = self.rel(self.plan.relations[ordinal].rel)
        name = self._alias()
        self.ctes.append((name, rows.query if rows.query is not None else rows.select_all(self._alias())))
        self.done[ordinal] = Rows(rows.names, rows.types, name=name)
        return self.done[ordinal]

    # -- relations -------------------------------------------------------------------------

    def rel(self, rel: Rel) -> Rows:
        name = rel.WhichOneof("rel_type")
        handler = self._rels.get(name or "")
        if handler is None:
            raise Unimplemented(f"Substrait import: {name or 'empty'} relations are not supported")
        return handler(getattr(rel, name))

    def _table(self, names: list[str]) -> str:
        """A stored table by its name (optionally qualified by Quail's catalog and schema)."""
        *prefix, name = names or [""]
        known = [p.lower() for p in prefix] in ([], [SCHEMA_NAME], [CATALOG_NAME, SCHEMA_NAME])
        if not known or not self.catalog.has(name):
            raise NotFound(f"table {'.'.join(names)!r} does not exist")
        return name

    def _read(self, read: ReadRel) -> Rows:
        if read.WhichOneof("read_type") != "named_table":
            raise Unimplemented(f"Substrait import: ReadRels of {read.WhichOneof('read_type')} are not supported")
        if read.HasField("projection"):
            raise Unimplemented("Substrait import: ReadRel projections are not supported (use an emit)")
        name = self._table(list(read.named_table.names))
        schema = self.catalog.schema(name)
        actual = {n.lower(): n for n in schema.names}
        names = [actual.get(n.lower(), n) for n in read.base_schema.names] or schema.names
        types = list(read.base_schema.struct.types) if read.HasField("base_schema") else \
            [from_arrow(f.type) for f in schema]
        missing = [n for n in names if n.lower() not in actual]
        if missing or len(types) != len(names):
            raise InvalidArgument(f"the base_schema of table {name!r} does not match it: "
                                  f"{f'no column(s) {missing}' if missing else 'names and types differ in number'}")
        rows = Rows(names, types, name=name)
        if names != schema.names:
            rows = Rows(names, types, rows.select_all(self._alias()))
        for condition in (read.filter, read.best_effort_filter):
            if condition.ByteSize():
                rows = self._where(rows, condition)
        return self._emitted(rows, read.common)

    def _where(self, rows: Rows, condition: Expression) -> Rows:
        query, fields = self._open(rows)
        return Rows(rows.names, rows.types, query.where(self.sql.sql(condition, fields), copy=False))

    def _filter(self, node: FilterRel) -> Rows:
        return self._emitted(self._where(self.rel(node.input), node.condition), node.common)

    def _project(self, node: ProjectRel) -> Rows:
        rows = self.rel(node.input)
        query, fields = self._open(rows)
        values = [Field(*self.sql.expression(e, fields)) for e in node.expressions]
        names = _unique(rows.names + [f"expr_{k}" for k in range(len(values))])
        query.set("expressions", _aliased(fields + values, names))
        return self._emitted(Rows(names, rows.types + [v.type for v in values], query), node.common)

    def _joined(self, left: Rows, right: Rows, join: Callable[[str, str, list[Field]], exp.Join]) -> Rows:
        la, ra = self._alias(), self._alias()
        fields = left.fields(la) + right.fields(ra)
        names = _unique(left.names + right.names)
        query = _select(fields, names).from_(left.source(la))
        query.set("joins", [join(la, ra, fields)])
        return Rows(names, left.types + right.types, query)

    def _join(self, node: JoinRel) -> Rows:
        if node.type not in _JOIN_SIDES:
            raise Unimplemented(f"Substrait import: {JoinRel.JoinType.Name(node.type)} joins are not supported")
        left, right = self.rel(node.left), self.rel(node.right)

        def join(la: str, ra: str, fields: list[Field]) -> exp.Join:
            on = self.sql.sql(node.expression, fields) if node.HasField("expression") else exp.true()
            side = _JOIN_SIDES[node.type]
            return exp.Join(this=right.source(ra), on=on, side=side, kind=None if side else "INNER")

        rows = self._joined(left, right, join)
        if node.HasField("post_join_filter"):
            rows = self._where(rows, node.post_join_filter)
        return self._emitted(rows, node.common)

    def _cross(self, node: CrossRel) -> Rows:
        right = self.rel(node.right)
        rows = self._joined(self.rel(node.left), right, lambda la, ra, f: exp.Join(this=right.source(ra), kind="CROSS"))
        return self._emitted(rows, node.common)

    def _aggregate(self, node: AggregateRel) -> Rows:
        if len(node.groupings) > 1:
            raise Unimplemented("Substrait import: several grouping sets are not supported")
        rows = self.rel(node.input)
        query, fields = self._open(rows)
        references = list(node.groupings[0].expression_references) if node.groupings else []
        if any(not 0 <= r < len(node.grouping_expressions) for r in references):
            raise InvalidArgument("a grouping names a grouping expression the AggregateRel does not have")
        keys = [node.grouping_expressions[r] for r in references]
        if any(m.HasField("filter") for m in node.measures):
            raise Unimplemented("Substrait import: filtered measures are not supported")
        grouped = [self.sql.expression(k, fields) for k in keys]
        measures = [self.sql.aggregate(m.measure, fields) for m in node.measures]
        if not grouped and not measures:
            raise InvalidArgument("an AggregateRel needs a grouping or a measure")
        names = _unique([rows.names[field_position(k)] if field_position(k) is not None else f"group_{i}"
                         for i, k in enumerate(keys)] + [f"measure_{i}" for i in range(len(measures))])
        values = [Field(v, t) for v, t in grouped + measures]
        query.set("expressions", _aliased(values, names))
        if grouped:
            query = query.group_by(*(v.copy() for v, _ in grouped), copy=False)
        return self._emitted(Rows(names, [v.type for v in values], query), node.common)

    def _sort(self, node: SortRel) -> Rows:
        rows = self.rel(node.input)
        query, fields = self._open(rows)
        keys = [self.sql.ordered(s, fields) for s in node.sorts]
        return self._emitted(Rows(rows.names, rows.types, query.order_by(*keys, copy=False)), node.common)

    def _fetch(self, node: FetchRel) -> Rows:
        count = self._count(node.count_expr, "count") if node.HasField("count_expr") else None
        offset = self._count(node.offset_expr, "offset") if node.HasField("offset_expr") else 0
        rows = self.rel(node.input)
        merge = rows.query is not None and not any(rows.query.args.get(k) for k in ("limit", "offset"))
        query = rows.query.copy() if merge else rows.select_all(self._alias())
        if count is not None:
            query = query.limit(count)
        if offset:
            query = query.offset(offset)
        return self._emitted(Rows(rows.names, rows.types, query), node.common)

    @staticmethod
    def _count(expression: Expression, what: str) -> int | None:
        """A FetchRel's count or offset: a whole-number literal (a NULL count: all rows)."""
        literal = expression.literal
        name = literal.WhichOneof("literal_type") if expression.HasField("literal") else None
        if name == "null" and what == "count":
            return None
        if name not in ("i32", "i64") or getattr(literal, name) < 0:
            raise Unimplemented(f"Substrait import: a FetchRel {what} must be a literal whole number")
        return getattr(literal, name)

    def _set(self, node: SetRel) -> Rows:
        if node.op not in _SET_OPS:
            raise Unimplemented(f"Substrait import: {SetRel.SetOp.Name(node.op)} is not supported (but UNION [ALL])")
        inputs = [self.rel(i) for i in node.inputs]
        if len(inputs) < 2 or len({len(i.names) for i in inputs}) != 1:
            raise InvalidArgument("a SetRel needs two or more inputs of as many columns each")
        selects = [i.select_all(self._alias()) for i in inputs]
        union = reduce(lambda a, b: exp.union(a, b, distinct=_SET_OPS[node.op]), selects)
        alias, first = self._alias(), inputs[0]
        query = exp.select(*(exp.alias_(f.sql, _ident(n)) for f, n in zip(first.fields(alias), first.names)))
        query = query.from_(exp.Subquery(this=union, alias=exp.TableAlias(this=_ident(alias))))
        return self._emitted(Rows(first.names, first.types, query), node.common)
