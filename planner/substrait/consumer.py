"""A Substrait plan as a physical plan: relations become DuckDB SQL steps, Quail's AI functions AI steps."""

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

from quail.engine.ai.options import Generation
from quail.engine.ai.kinds import KINDS
from quail.engine.errors import InvalidArgument, NotFound, Unimplemented
from quail.engine.exec.catalog import Catalog
from quail.engine.exec.plan import AIFilterChain, AIStep, PhysicalPlan, SQLStep, Step
from quail.engine.runtime.prompt import LAYOUTS

from quail.planner.binder import CATALOG_NAME, SCHEMA_NAME
from quail.planner.planner import RESULT
from quail.planner.streaming import stream_in_chunks
from quail.planner.substrait.expressions import field_position
from quail.planner.substrait.functions import AI_FUNCTIONS, AI_URN, declared_functions
from quail.planner.substrait.to_sql import Field, SQLExpressions
from quail.planner.substrait.types import STRINGS, from_arrow, kind, of

QUERY_TEXT = "<Substrait plan>"  # a Substrait plan's query text where queries are listed
_AI_KINDS = {name: kind_ for kind_, name in AI_FUNCTIONS.items()}
_ANSWERS = ("letters", "names", "text")
_JOIN_SIDES = {JoinRel.JOIN_TYPE_INNER: None, JoinRel.JOIN_TYPE_LEFT: "LEFT", JoinRel.JOIN_TYPE_RIGHT: "RIGHT",
               JoinRel.JOIN_TYPE_OUTER: "FULL"}
_SET_OPS = {SetRel.SET_OP_UNION_ALL: False, SetRel.SET_OP_UNION_DISTINCT: True}


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


def import_plan(data: bytes, catalog: Catalog) -> PhysicalPlan:
    """The physical plan of a serialized Substrait plan over the catalog's tables."""
    return stream_in_chunks(_Importer(parse_plan(data), catalog).physical())


@dataclass(frozen=True)
class Rows:
    """A relation as SQL, with its columns' names and types.

    A relation as SQL: a named relation (a step's output, a stored table) or a SELECT with one aliased
    expression per column; its columns' names and types."""

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


@dataclass(frozen=True)
class _AICall:
    """A call of an AI function, its arguments checked."""

    kind: str
    template: str
    layout: str
    answers: str
    anchor: int
    selectivity: float
    labels: tuple[str, ...]
    documents: list[Expression]
    generation: Generation | None = None


def _ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def _select(fields: list[Field], names: list[str]) -> exp.Select:
    return exp.select(*(exp.alias_(f.sql, _ident(n)) for f, n in zip(fields, names)))


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


def _common(rel: Rel) -> RelCommon | None:
    body = getattr(rel, rel.WhichOneof("rel_type") or "", None)
    return body.common if body is not None and "common" in body.DESCRIPTOR.fields_by_name else None


def _mapping(common: RelCommon, width: int) -> list[int]:
    """The positions a relation's emit outputs (all `width` of them without one)."""
    mapping = list(common.emit.output_mapping) if common.HasField("emit") else list(range(width))
    if any(not 0 <= i < width for i in mapping):
        raise InvalidArgument(f"an emit names a field beyond the {width} of its relation")
    return mapping


def _references(message: Message) -> set[int]:
    """The input positions the plain field references inside a message read."""
    found = set()
    if isinstance(message, Expression):
        position = field_position(message)
        if position is not None:
            return {position}
    for descriptor, value in message.ListFields():
        if descriptor.message_type is not None:
            for item in ([value] if isinstance(value, Message) else value):
                found |= _references(item)
    return found


class _Importer:
    """Lowers a plan's relations to steps.

    Each plan relation becomes one step (none when it is already a named
    relation), named by its hint alias when it has a free one, in the plan's
    order. An ai_filter FilterRel becomes an AI filter step, nested ones (or ones
    under a FetchRel) an AI filter chain; a ProjectRel's ai_bool, ai_score and
    ai_classify expressions become AI steps adding their columns. A document
    argument that is a string column nothing else keeps is read as it is; any
    other is first cast to text by a SQL step.
    """

    def __init__(self, plan: Plan, catalog: Catalog) -> None:
        self.plan = plan
        self.catalog = catalog
        self.functions = declared_functions(plan)
        self.sql = SQLExpressions(self.functions, self._subquery)
        self.steps: list[Step] = []
        self.tables: list[str] = []
        self.used: set[str] = set()
        self.done: dict[int, Rows] = {}
        self.active: set[int] = set()
        self.aliases = 0
        self.nested = 0  # how deep in subquery expressions the relations being lowered are
        self._rels: dict[str, Callable[[Message], Rows]] = {
            "read": self._read, "reference": lambda r: self._plan_rel(r.subtree_ordinal), "filter": self._filter,
            "project": self._project, "join": self._join, "cross": self._cross, "aggregate": self._aggregate,
            "sort": self._sort, "fetch": self._fetch, "set": self._set,
        }

    def physical(self) -> PhysicalPlan:
        roots = [r.root for r in self.plan.relations if r.WhichOneof("rel_type") == "root"]
        if len(roots) != 1:
            raise InvalidArgument(f"a Substrait plan needs one root relation, this one has {len(roots)}")
        (root,) = roots
        for ordinal, relation in enumerate(self.plan.relations):  # in the plan's order: the steps keep theirs
            if relation.WhichOneof("rel_type") == "rel":
                self._plan_rel(ordinal)
        rows = self.rel(root.input)
        names = list(root.names)
        if len(names) != len(rows.names):
            raise InvalidArgument(f"the plan's root names {len(names)} columns; its relation gives {len(rows.names)}")
        if rows.name in self.tables:  # the result is a step's output, never a stored table
            rows = Rows(rows.names, rows.types, rows.select_all(self._alias()))
        common = _common(root.input)
        result = self._materialize(rows, names, (common.hint.alias if common else "") or RESULT, "result")
        return PhysicalPlan(tuple(self.steps), tuple(self.tables), result.name)

    # -- names and steps -------------------------------------------------------------------

    def _alias(self) -> str:
        self.aliases += 1
        return f"__s{self.aliases}"

    def _claim(self, wanted: str, stem: str) -> str:
        """A step output name: `wanted` when it is free, else a fresh one."""
        name, n = wanted, 0
        while not name or name.lower() in self.used or self.catalog.has(name):
            n += 1
            name = f"__quail_{stem}_{n}"
        self.used.add(name.lower())
        return name

    def _named(self, rows: Rows, stem: str = "step") -> Rows:
        """The rows as a named relation (their SELECT a SQL step of its own)."""
        return rows if rows.name is not None else self._materialize(rows, rows.names, "", stem)

    def _materialize(self, rows: Rows, names: list[str], wanted: str, stem: str) -> Rows:
        """The rows as a relation named `wanted` (when free) with these column names."""
        if rows.name is not None and names == rows.names:
            return rows
        alias = self._alias()
        query = rows.query.copy() if rows.query is not None else rows.select_all(alias)
        query.set("expressions", [exp.alias_(e.unalias(), _ident(n)) for e, n in zip(query.expressions, names)])
        name = self._claim(wanted, stem)
        self.steps.append(SQLStep(query.sql("duckdb"), name))
        return Rows(names, rows.types, name=name)

    def _emitted(self, rows: Rows, common: RelCommon) -> Rows:
        """The columns a relation's emit chooses."""
        mapping = _mapping(common, len(rows.names))
        if mapping == list(range(len(rows.names))):
            return rows
        query = rows.query.copy() if rows.query is not None else rows.select_all(self._alias())
        names = _unique([rows.names[i] for i in mapping])
        query.set("expressions", [exp.alias_(query.expressions[i].unalias().copy(), _ident(n))
                                  for i, n in zip(mapping, names)])
        return Rows(names, [rows.types[i] for i in mapping], query)

    def _subquery(self, rel: Rel) -> tuple[exp.Select, list[Type]]:
        """A subquery expression's relation as one SELECT (no steps: it may read the enclosing query's columns)."""
        self.nested += 1
        try:
            rows = self.rel(rel)
        finally:
            self.nested -= 1
        return (rows.query if rows.query is not None else rows.select_all(self._alias())), rows.types

    def _plan_rel(self, ordinal: int) -> Rows:
        """The step computing a plan relation that a ReferenceRel reads."""
        if ordinal in self.done:
            return self.done[ordinal]
        if not 0 <= ordinal < len(self.plan.relations) or self.plan.relations[ordinal].WhichOneof("rel_type") != "rel":
            raise InvalidArgument(f"a ReferenceRel reads plan relation {ordinal}, which is no (non-root) relation")
        if ordinal in self.active:
            raise InvalidArgument(f"plan relation {ordinal} references itself")
        self.active.add(ordinal)
        rel = self.plan.relations[ordinal].rel
        rows = self.rel(rel)
        common = _common(rel)
        hinted = list(common.hint.output_names) if common else []
        names = hinted if len(hinted) == len(rows.names) and _unique(hinted) == hinted else rows.names
        self.done[ordinal] = self._materialize(rows, names, common.hint.alias if common else "", "rel")
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
        if name.lower() not in (t.lower() for t in self.tables):
            self.tables.append(name)
        return next(t for t in self.tables if t.lower() == name.lower())

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
        alias = self._alias()
        return Rows(rows.names, rows.types, rows.select_all(alias).where(self.sql.sql(condition, rows.fields(alias))))

    def _filter(self, node: FilterRel) -> Rows:
        if self._ai_call(node.condition) is not None:
            return self._ai_filters(node, None)
        return self._emitted(self._where(self.rel(node.input), node.condition), node.common)

    def _project(self, node: ProjectRel) -> Rows:
        if any(self._ai_call(e) is not None for e in node.expressions):
            return self._ai_project(node)
        rows = self.rel(node.input)
        alias = self._alias()
        fields = rows.fields(alias)
        values = [self.sql.expression(e, fields) for e in node.expressions]
        names = _unique(rows.names + [f"expr_{k}" for k in range(len(values))])
        query = _select(fields + [Field(v, t) for v, t in values], names).from_(rows.source(alias))
        return self._emitted(Rows(names, rows.types + [t for _, t in values], query), node.common)

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
        alias = self._alias()
        fields = rows.fields(alias)
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
        query = _select(values, names).from_(rows.source(alias))
        if grouped:
            query = query.group_by(*(v.copy() for v, _ in grouped))
        return self._emitted(Rows(names, [v.type for v in values], query), node.common)

    def _sort(self, node: SortRel) -> Rows:
        rows = self.rel(node.input)
        alias = self._alias()
        keys = [self.sql.ordered(s, rows.fields(alias)) for s in node.sorts]
        return self._emitted(Rows(rows.names, rows.types, rows.select_all(alias).order_by(*keys)), node.common)

    def _fetch(self, node: FetchRel) -> Rows:
        count = self._count(node.count_expr, "count") if node.HasField("count_expr") else None
        offset = self._count(node.offset_expr, "offset") if node.HasField("offset_expr") else 0
        if count is not None and not offset and self._is_ai_filter(node.input):
            return self._emitted(self._ai_filters(node.input.filter, count), node.common)
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

    # -- AI functions ----------------------------------------------------------------------

    def _ai_call(self, expression: Expression) -> _AICall | None:
        """The AI function call an expression is (its arguments checked), None when it is none."""
        function = expression.scalar_function
        declared = self.functions.get(function.function_reference) if expression.HasField("scalar_function") else None
        if declared is None or declared.urn != AI_URN or declared.base not in _AI_KINDS:
            return None
        if self.nested:
            raise Unimplemented("Substrait import: AI functions inside subquery expressions are not supported")
        args = function.arguments
        generating = _AI_KINDS[declared.base] == "complete"
        if len(args) != 7 + generating:
            raise InvalidArgument(f"{declared.base} takes {7 + generating} arguments (template, layout, answers, "
                                  f"anchor, selectivity, labels, documents{', generation' if generating else ''}), "
                                  f"not {len(args)}")
        template, anchor, selectivity = (_literal(args[i], name, declared.base) for i, name in
                                         ((0, "string"), (3, "i32"), (4, "fp64")))
        layout, answers = args[1].enum, args[2].enum
        labels = tuple(v.string for v in args[5].value.literal.list.values)
        documents = list(args[6].value.nested.list.values)
        listed = (args[5].value.literal.WhichOneof("literal_type") in ("list", "empty_list"),
                  args[6].value.nested.WhichOneof("nested_type") == "list")
        generation = Generation.from_json(_literal(args[7], "string", declared.base)) if generating else None
        call = _AICall(_AI_KINDS[declared.base], template, layout, answers, anchor, selectivity, labels, documents,
                       generation)
        problems = [layout not in LAYOUTS and f"layout {layout!r}", answers not in _ANSWERS and f"answers {answers!r}",
                    not listed[0] and "labels (a list literal)",
                    not (listed[1] and documents) and "documents (a nested list of expressions)",
                    not 0 <= anchor < len(documents) and f"anchor {anchor}",
                    not 0 < selectivity <= 1 and f"selectivity {selectivity}",
                    (call.kind == "classify") != bool(labels) and "labels (classify only)",
                    generating != (answers == "text") and f"answers {answers!r} for {declared.base}"]
        problems = [p for p in problems if p]
        if problems:
            raise InvalidArgument(f"{declared.base}: bad {', '.join(problems)}")
        return call

    def _is_ai_filter(self, rel: Rel) -> bool:
        return rel.HasField("filter") and self._ai_call(rel.filter.condition) is not None

    def _ask(self, call: _AICall, current: Rows, inputs: list[str], keep: set[str], output: str, column: str) -> Rows:
        """One AI step over a named relation, whose field references name the columns `inputs` names. Documents
        that are string columns nothing else needs (`keep`: names needed later) are read directly and dropped
        by the step; others first become text columns."""
        positions = [field_position(d) for d in call.documents]
        if any(p is not None and not 0 <= p < len(inputs) for p in positions):
            raise InvalidArgument(f"an AI function's document names a field beyond the {len(inputs)} of its input")
        types = dict(zip(current.names, current.types))
        names = [inputs[p] if p is not None else None for p in positions]
        if None not in names and len(set(names)) == len(names) and not keep & set(names) and \
                all(kind(types[n]) in STRINGS for n in names):
            args = names
        else:
            current, args = self._as_text(current, call.documents, inputs)
        name = self._claim(output, "ai")
        self.steps.append(AIStep(current.name, name, call.kind, call.template, tuple(args), call.layout, call.labels,
                                 column, call.selectivity, call.anchor, call.answers, generation=call.generation))
        kept = [i for i, n in enumerate(current.names) if n not in args]
        return Rows([current.names[i] for i in kept] + ([column] if column else []),
                    [current.types[i] for i in kept] + ([from_arrow(KINDS[call.kind].value)] if column else []),
                    name=name)

    def _as_text(self, current: Rows, documents: list[Expression], inputs: list[str]) -> tuple[Rows, list[str]]:
        """A SQL step adding the documents, cast to text, as columns; their names."""
        alias = self._alias()
        fields = current.fields(alias)
        by_name = dict(zip(current.names, fields))
        names = _unique(current.names + [f"__quail_doc_{k}" for k in range(len(documents))])
        texts = [Field(exp.cast(self.sql.sql(d, [by_name.get(n) for n in inputs]), "VARCHAR"), of("string"))
                 for d in documents]
        query = _select(fields + texts, names).from_(current.source(alias))
        return self._named(Rows(names, current.types + [t.type for t in texts], query)), names[len(current.names):]

    def _ai_filters(self, top: FilterRel, limit: int | None) -> Rows:
        """Nested AI FilterRels, innermost first, as AI filter steps: one chain when they follow one another
        directly and are several or under a limit; otherwise (a SQL step between them) a LIMIT after them."""
        stack = [top]
        while self._is_ai_filter(stack[-1].input):
            stack.append(stack[-1].input.filter)
        current = self._named(self.rel(stack[-1].input))
        start = len(self.steps)
        for node in reversed(stack):
            call = self._ai_call(node.condition)
            mapping = _mapping(node.common, len(current.names))
            wanted = [current.names[i] for i in mapping]
            current = self._ask(call, current, current.names, set(wanted), node.common.hint.alias, "")
            current = self._named(self._columns(current, wanted))
        asked = self.steps[start:]
        if all(isinstance(s, AIStep) for s in asked) and (limit is not None or len(asked) > 1):
            self.steps[start:] = [AIFilterChain.over(asked, limit)]
        elif limit is not None:
            current = Rows(current.names, current.types, current.select_all(self._alias()).limit(limit))
        return current

    def _columns(self, rows: Rows, names: list[str]) -> Rows:
        """The named rows' columns of these names, in this order."""
        if names == rows.names:
            return rows
        if any(n not in rows.names for n in names):
            raise InvalidArgument(f"an AI relation's emit keeps a column its step drops: {names}")
        alias = self._alias()
        fields = {n: f for n, f in zip(rows.names, rows.fields(alias))}
        unique = _unique(names)
        query = _select([fields[n] for n in names], unique).from_(rows.source(alias))
        return Rows(unique, [fields[n].type for n in names], query)

    def _ai_project(self, node: ProjectRel) -> Rows:
        """A ProjectRel with AI expressions: an AI step per AI expression, then its other expressions and emit."""
        current = self._named(self.rel(node.input))
        base = len(current.names)
        mapping = _mapping(node.common, base + len(node.expressions))
        hinted = list(node.common.hint.output_names)
        calls = {k: self._ai_call(e) for k, e in enumerate(node.expressions)}
        asks = [k for k, call in calls.items() if call is not None]
        originals, columns = list(current.names), {}
        for k in asks:  # each AI value's column: named as the hint names its output, else afresh
            wanted = hinted[mapping.index(base + k)] if len(hinted) == len(mapping) and base + k in mapping else ""
            columns[k] = _unique([*originals, *columns.values(), wanted or f"__quail_value_{k}"])[-1]
        for k in asks:
            needed = {i for i in mapping if i < base}.union(*(_references(e) for j, e in enumerate(node.expressions)
                                                              if j != k))
            output = node.common.hint.alias if k == asks[-1] else ""
            current = self._ask(calls[k], current, originals, {originals[i] for i in needed if i < base}, output,
                                columns[k])
        alias = self._alias()
        fields = {n: f for n, f in zip(current.names, current.fields(alias))}
        inputs = [fields.get(n) for n in originals]
        chosen = []
        for m in mapping:
            if m < base:
                chosen.append((originals[m], fields[originals[m]]))
            elif m - base in columns:
                chosen.append((columns[m - base], fields[columns[m - base]]))
            else:
                chosen.append((f"expr_{m - base}", Field(*self.sql.expression(node.expressions[m - base], inputs))))
        names = _unique([n for n, _ in chosen])
        if names == current.names and all(m < base or m - base in columns for m in mapping):
            return current
        query = _select([f for _, f in chosen], names).from_(current.source(alias))
        return Rows(names, [f.type for _, f in chosen], query)


def _literal(argument: Message, kind_: str, function: str) -> object:
    literal = argument.value.literal
    if argument.WhichOneof("arg_type") != "value" or literal.WhichOneof("literal_type") != kind_:
        raise InvalidArgument(f"{function}: expected a {kind_} literal argument")
    return getattr(literal, kind_)
