"""From SQL text to a physical plan: parse, bind, push relational work below AI work, emit steps.

The AI core of a query runs in the engine; everything around it (projection,
grouping, ordering, limits) runs in DuckDB over the core's Arrow output.
"""

from __future__ import annotations

from typing import Any, Sequence

from sqlglot import exp

from quail.engine.catalog import Catalog
from quail.engine.errors import InvalidArgument
from quail.engine.physical import AIFilterStep, PhysicalPlan, SQLStep

from .ai_functions import AIPredicate, ai_calls, bind_filter, contains_ai
from .binder import bind_parameters, bind_tables
from .dialects import DEFAULT_DIALECT, parse_statement, position

RESULT = "__quail_result"
ROWS = "__quail_rows"


def plan_sql(sql: str, catalog: Catalog, dialect: str = DEFAULT_DIALECT,
             params: Sequence[Any] | None = None) -> PhysicalPlan:
    """The physical plan of one query; params bind its `?` placeholders (None binds NULLs)."""
    tree = parse_statement(sql, dialect)
    if not isinstance(tree, exp.Query):
        raise InvalidArgument(f"only queries are supported here, not {tree.key.upper()} statements")
    tables = bind_tables(tree, catalog)
    bind_parameters(tree, params)
    if not ai_calls(tree):
        return PhysicalPlan((SQLStep(tree.sql("duckdb"), RESULT),), tables, RESULT)
    return plan_ai_filters(tree, tables)


def conjuncts(condition: exp.Expression | None) -> list[exp.Expression]:
    """The top-level AND terms of a condition."""
    if condition is None:
        return []
    if isinstance(condition, exp.Paren):
        return conjuncts(condition.this)
    if isinstance(condition, exp.And):
        return conjuncts(condition.left) + conjuncts(condition.right)
    return [condition]


def _unsupported(node: exp.Expression) -> InvalidArgument:
    return InvalidArgument(
        "AI_FILTER is supported as a top-level AND condition of the WHERE clause of a "
        f"single-table SELECT{position(node)}"
    )


def plan_ai_filters(select: exp.Query, tables: tuple[str, ...]) -> PhysicalPlan:
    """SELECT ... FROM t WHERE <relational> AND AI_FILTER(...) ...: relational filter, AI filters, rest."""
    first_call = ai_calls(select)[0]
    source = select.args.get("from_")
    if not isinstance(select, exp.Select) or select.args.get("joins") or source is None \
            or not isinstance(source.this, exp.Table) or select.args.get("with_"):
        raise _unsupported(first_call)
    where = select.args.get("where")
    terms = conjuncts(where.this if where else None)
    ai_terms = [t for t in terms if contains_ai(t)]
    for term in ai_terms:
        if ai_calls(term)[0] is not term:
            raise _unsupported(term)
    if len(ai_terms) != len(ai_calls(select)):
        raise _unsupported(next(c for c in ai_calls(select) if c not in ai_terms))
    predicates = [bind_filter(t) for t in ai_terms]
    relational = [t for t in terms if not contains_ai(t)]
    table = source.this
    alias = table.alias_or_name
    steps: list = [SQLStep(_candidate_rows(table, alias, relational, predicates), ROWS)]
    current = ROWS
    for k, predicate in enumerate(predicates):
        output = f"__quail_ai_{k}"
        steps.append(AIFilterStep(current, output, predicate.template, _arg_names(k, predicate)))
        current = output
    final = select.copy()
    final.set("where", None)
    final.set("from_", exp.From(this=exp.Table(this=exp.to_identifier(current),
                                               alias=exp.TableAlias(this=exp.to_identifier(alias)))))
    steps.append(SQLStep(final.sql("duckdb"), RESULT))
    return PhysicalPlan(tuple(steps), tables, RESULT)


def _arg_names(k: int, predicate: AIPredicate) -> tuple[str, ...]:
    return tuple(f"__quail_arg_{k}_{j}" for j in range(len(predicate.args)))


def _candidate_rows(table: exp.Table, alias: str, relational: list[exp.Expression],
                    predicates: list[AIPredicate]) -> str:
    """Rows that pass every relational condition, with each AI argument cast to text."""
    columns: list[exp.Expression] = [exp.Column(this=exp.Star(), table=exp.to_identifier(alias))]
    for k, predicate in enumerate(predicates):
        for name, arg in zip(_arg_names(k, predicate), predicate.args):
            columns.append(exp.alias_(exp.cast(arg.copy(), exp.DataType.build("VARCHAR")), name))
    query = exp.select(*columns).from_(table.copy())
    if relational:
        query = query.where(exp.and_(*(t.copy() for t in relational)))
    return query.sql("duckdb")
