"""A physical plan as a Substrait plan: SQL steps as relational algebra, AI steps as calls of AI functions."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import sqlglot
from sqlglot.errors import ParseError
from substrait.algebra_pb2 import Expression, FetchRel, FilterRel, ProjectRel, ReadRel, ReferenceRel, Rel, RelRoot
from substrait.plan_pb2 import Plan, PlanRel, Version
from substrait.version import substrait_version

from quail.engine.ai.kinds import KINDS
from quail.engine.errors import InvalidArgument, Unimplemented
from quail.engine.exec.catalog import Catalog
from quail.engine.exec.plan import AIAggregate, AIFilterChain, AIStep, JoinChoice, PhysicalPlan, SQLStep, Step
from quail.engine.exec.relational import DuckDB

from quail.planner.substrait.expressions import Column, Expressions, Relation, Typed, field_ref, literal
from quail.planner.substrait.functions import AI_FUNCTIONS, Extensions
from quail.planner.substrait.relations import Queries, common, emitted, with_common
from quail.planner.substrait.types import STRINGS, kind, list_of, named_struct, of

SUBSTRAIT_VERSION = substrait_version  # the Substrait release the plans are written in
PRODUCER = "quail"


AGGREGATES_UNSUPPORTED = "Substrait export: AI aggregates (AI_AGG, AI_SUMMARIZE_AGG) are not supported yet"


def export_plan(plan: PhysicalPlan, catalog: Catalog) -> Plan:
    """The Substrait plan of a physical plan (a join chosen at run time: its planned order)."""
    if plan.analyze:
        raise InvalidArgument("EXPLAIN ANALYZE runs its query: it has no Substrait plan")
    steps = [s for step in plan.steps for s in step.planned()]
    if any(isinstance(step, AIAggregate) for step in steps):  # before its texts' SQL step, which lists them
        raise Unimplemented(AGGREGATES_UNSUPPORTED)
    with DuckDB() as db:
        return _Exporter(plan, catalog, db).plan(steps)


def version() -> Version:
    major, minor, patch = (int(part) for part in SUBSTRAIT_VERSION.split(".")[:3])
    return Version(major_number=major, minor_number=minor, patch_number=patch, producer=PRODUCER)


@dataclass(frozen=True)
class _Output:
    """An exported step's output: the plan relation holding it, its columns, and its Arrow schema."""

    ordinal: int
    columns: list[Column]
    schema: pa.Schema


class _Exporter:
    """One plan relation per step (its hint: the step's output and column names), read by later steps
    through ReferenceRels; the last step is the root. AI steps call the functions of quail_ai_functions.yaml."""

    def __init__(self, plan: PhysicalPlan, catalog: Catalog, db: DuckDB) -> None:
        self.catalog = catalog
        self.db = db
        self.functions = Extensions()
        self.expressions = Expressions(self.functions)
        self.queries = Queries(self.expressions, self._source)
        self.relations: list[PlanRel] = []
        self.outputs: dict[str, _Output] = {}
        self.empty = {name: catalog.schema(name).empty_table() for name in plan.tables}

    def plan(self, steps: list[Step]) -> Plan:
        for i, step in enumerate(steps):
            relation, schema = step.visit(self)
            rel = _hinted(relation.rel, step.output, schema.names)
            if i == len(steps) - 1:
                self.relations.append(PlanRel(root=RelRoot(input=rel, names=schema.names)))
            else:
                self.outputs[step.output.lower()] = _Output(len(self.relations), relation.columns, schema)
                self.relations.append(PlanRel(rel=rel))
            self.empty[step.output] = schema.empty_table()
        plan = Plan(version=version(), relations=self.relations)
        self.functions.declare(plan)
        return plan

    def _source(self, name: str) -> Relation | None:
        """A step's output (a ReferenceRel to its plan relation) or a stored table (a ReadRel)."""
        output = self.outputs.get(name.lower())
        if output is not None:
            return Relation(Rel(reference=ReferenceRel(subtree_ordinal=output.ordinal)), output.columns)
        if not self.catalog.has(name):
            return None
        schema = named_struct(self.catalog.schema(name))
        read = ReadRel(base_schema=schema, named_table=ReadRel.NamedTable(names=[name]))
        return Relation(Rel(read=read), [Column(None, n, t) for n, t in zip(schema.names, schema.struct.types)])

    def _input(self, step: AIStep | AIFilterChain) -> tuple[Relation, pa.Schema]:
        source = self._source(step.input)
        if source is None:
            raise InvalidArgument(f"Substrait export: step input {step.input!r} is not defined before it")
        return source, self.empty[step.input].schema

    def sql_step(self, step: SQLStep) -> tuple[Relation, pa.Schema]:
        return self._sql(step)

    def ai_step(self, step: AIStep) -> tuple[Relation, pa.Schema]:
        if step.targets is not None:  # exported without them, the plan would run as the exact query
            raise Unimplemented("Substrait export: a cascade's recall and precision targets are not supported yet")
        return self._ai(step, *self._input(step))

    def ai_chain(self, step: AIFilterChain) -> tuple[Relation, pa.Schema]:
        return self._chain(step, *self._input(step))

    def join_choice(self, step: JoinChoice) -> tuple[Relation, pa.Schema]:
        raise AssertionError("a join choice is exported as its planned steps")

    def ai_aggregate(self, step: AIAggregate) -> tuple[Relation, pa.Schema]:
        raise Unimplemented(AGGREGATES_UNSUPPORTED)

    def _sql(self, step: SQLStep) -> tuple[Relation, pa.Schema]:
        try:
            tree = sqlglot.parse_one(step.sql, read="duckdb")
        except ParseError as err:
            raise InvalidArgument(f"Substrait export: step {step.output} is not DuckDB SQL: {err}") from None
        relation = self.queries.query(tree)
        schema = self.db.run(step.sql, self.empty).schema
        if len(schema) != len(relation.columns):
            raise InvalidArgument(f"Substrait export: step {step.output} gives {len(schema)} columns, "
                                  f"its translation {len(relation.columns)}")
        return Relation(relation.rel, [Column(None, n, c.type) for n, c in zip(schema.names, relation.columns)]), schema

    def _chain(self, chain: AIFilterChain, source: Relation, schema: pa.Schema) -> tuple[Relation, pa.Schema]:
        """Nested FilterRels, each named as its filter's output; a FetchRel above them for a limit."""
        for ask in chain.filters:
            source, schema = self._ai(ask, source, schema)
            source = Relation(_hinted(source.rel, ask.output, schema.names), source.columns)
        if chain.limit is not None:
            fetch = FetchRel(input=source.rel, count_expr=literal("i64", chain.limit).expression)
            source = Relation(Rel(fetch=fetch), source.columns)
        return source, schema

    def _ai(self, step: AIStep, source: Relation, schema: pa.Schema) -> tuple[Relation, pa.Schema]:
        """A FilterRel (filter) or a ProjectRel adding `column`, emitting all but the argument columns."""
        names = [c.name for c in source.columns]
        missing = [a for a in step.arg_columns if a not in names]
        if missing:
            raise InvalidArgument(f"Substrait export: AI step {step.output} reads missing columns {missing}")
        call = self._ai_call(step, [names.index(a) for a in step.arg_columns], source)
        kept = [i for i, name in enumerate(names) if name not in step.arg_columns]
        columns = [source.columns[i] for i in kept]
        remaining = pa.schema([schema.field(i) for i in kept])
        if step.kind == "filter":
            rel = Rel(filter=FilterRel(input=source.rel, condition=call.expression))
            return emitted(Relation(rel, source.columns), kept, columns), remaining
        rel = Rel(project=ProjectRel(input=source.rel, expressions=[call.expression]))
        added = Column(None, step.column, call.type)
        return (emitted(Relation(rel, source.columns + [added]), kept + [len(names)], columns + [added]),
                remaining.append(pa.field(step.column, KINDS[step.kind].value)))

    def _ai_call(self, step: AIStep, positions: list[int], source: Relation) -> Typed:
        """ai_<kind>(template, layout, answers, anchor, selectivity, labels, documents[, generation]): a
        generating step's options follow as a JSON object."""
        for p in positions:
            if kind(source.columns[p].type) not in STRINGS:
                raise InvalidArgument(f"Substrait export: AI step {step.output} reads {source.columns[p].name}, "
                                      f"not a string column")
        documents = Expression.Nested(list=Expression.Nested.List(values=[field_ref(p) for p in positions]))
        args = [literal("string", step.template), step.layout, step.answers, literal("i32", step.anchor),
                literal("fp64", step.selectivity), _labels(step.labels),
                Typed(Expression(nested=documents), list_of(of("string")))]
        if step.generation is not None:
            args.append(literal("string", step.generation.to_json()))
        return self.expressions.call(AI_FUNCTIONS[step.kind], args)


def _labels(labels: tuple[str, ...]) -> Typed:
    """A classify question's categories as a list literal (others: an empty list)."""
    type_ = list_of(of("string", nullable=False))
    values = Expression.Literal.List(values=[Expression.Literal(string=label) for label in labels])
    found = Expression.Literal(list=values) if labels else Expression.Literal(empty_list=type_.list)
    return Typed(Expression(literal=found), type_)


def _hinted(rel: Rel, alias: str, names: list[str]) -> Rel:
    """The relation named (hint alias) as the step output it computes, with its columns' names."""
    rel = with_common(rel)
    hint = common(rel).hint
    hint.alias = alias
    del hint.output_names[:]
    hint.output_names.extend(names)
    return rel
