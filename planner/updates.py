"""Statements that change the stored tables: CREATE TABLE [AS], INSERT INTO, DROP TABLE.

Each becomes an `UpdatePlan`: the rows to write (a query plan, AI functions and
all) and how to write them; the server applies it to its table store in one
atomic commit, so a table is either the old one or the new one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from sqlglot import exp

from quail.engine.errors import InvalidArgument
from quail.engine.exec.catalog import Catalog
from quail.engine.exec.plan import PhysicalPlan
from quail.engine.runtime.requests import ResidentShare

from quail.planner.binder import bind_parameters
from quail.planner.dialects import parse_statement, position
from quail.planner.explain import split_explain
from quail.planner.join_order import Rank, by_tokens
from quail.planner.planner import name_ai_columns, plan_query, plan_sql

UPDATES = (exp.Create, exp.Insert, exp.Drop)


@dataclass(frozen=True)
class UpdatePlan:
    """Write `query`'s rows to `table` (if_exists: fail, append, replace or keep; if_missing: create or
    fail), or with `query` None drop it (missing_ok: DROP ... IF EXISTS). `columns` renames the
    query's columns first (INSERT's target columns, in order). `parameters`: the statement's `?`
    placeholders; `rows_are_parameters`: the statement is `INSERT INTO t [(columns)] VALUES (?, ..., ?)`,
    whose rows are its parameter rows as bound (so many rows are written without a plan each)."""

    table: str
    query: PhysicalPlan | None
    if_exists: str = "fail"
    if_missing: str = "create"
    columns: tuple[str, ...] = ()
    missing_ok: bool = False
    parameters: int = 0
    rows_are_parameters: bool = False


def plan_statement(sql: str, catalog: Catalog, dialect: str, params: Sequence[Any] | None = None,
                   rank: Rank = by_tokens, resident: ResidentShare | None = None) -> PhysicalPlan | UpdatePlan:
    """One statement, parsed once: a query's plan (plan_sql), or a CREATE / INSERT / DROP's. Planned to run,
    its AI steps do not carry the document tokens they expect resident; an EXPLAIN's do (it shows them)."""
    if split_explain(sql) is not None:
        return plan_sql(sql, catalog, dialect, params, rank=rank, resident=resident)
    tree = name_ai_columns(parse_statement(sql, dialect), dialect)
    if not isinstance(tree, UPDATES):
        return plan_query(tree, catalog, params, rank=rank, resident=resident, documents=False)
    holders = _only_parameters(tree)
    parameters = bind_parameters(tree, params)
    return replace(_plan_update(tree, catalog, rank, resident), parameters=parameters,
                   rows_are_parameters=holders)


def _only_parameters(tree: exp.Expression) -> bool:
    """Whether a statement is INSERT ... VALUES of one row of placeholders alone."""
    body = tree.expression if isinstance(tree, exp.Insert) else None
    return isinstance(body, exp.Values) and len(body.expressions) == 1 and bool(body.expressions[0].expressions) \
        and all(isinstance(e, exp.Placeholder) for e in body.expressions[0].expressions)


def _plan_update(tree: exp.Expression, catalog: Catalog, rank: Rank, resident: ResidentShare | None) -> UpdatePlan:
    """The plan of a parsed CREATE TABLE, INSERT INTO or DROP TABLE statement."""
    if isinstance(tree, exp.Drop):
        if (tree.args.get("kind") or "").upper() != "TABLE":
            raise InvalidArgument(f"only DROP TABLE is supported{position(tree)}")
        tables = tree.args.get("tables") or []
        if len(tables) != 1:
            raise InvalidArgument(f"DROP TABLE drops one table at a time{position(tree)}")
        return UpdatePlan(_name(tables[0]), None, missing_ok=bool(tree.args.get("exists")))
    if isinstance(tree, exp.Create):
        if (tree.args.get("kind") or "").upper() != "TABLE":
            raise InvalidArgument(f"only CREATE TABLE is supported{position(tree)}")
        target, body = tree.this, tree.expression
        if isinstance(target, exp.Schema):  # CREATE TABLE t (column type, ...)
            if body is not None:
                raise InvalidArgument(f"CREATE TABLE takes columns or AS a query, not both{position(tree)}")
            body = _empty_rows(target)
            target = target.this
        if not isinstance(body, exp.Query):
            raise InvalidArgument(f"CREATE TABLE needs columns or AS a query{position(tree)}")
        if_exists = "replace" if tree.args.get("replace") else "keep" if tree.args.get("exists") else "fail"
        return UpdatePlan(_name(target), plan_query(body, catalog, rank=rank, resident=resident, documents=False),
                          if_exists)
    if isinstance(tree, exp.Insert):
        target, body = tree.this, tree.expression
        columns: tuple[str, ...] = ()
        if isinstance(target, exp.Schema):  # INSERT INTO t (a, b) ...
            columns = tuple(c.name for c in target.expressions)
            target = target.this
        if isinstance(body, exp.Values):
            body = exp.select(exp.Star()).from_(exp.Subquery(this=body))
        if not isinstance(body, exp.Query):
            raise InvalidArgument(f"INSERT INTO takes a query or VALUES{position(tree)}")
        return UpdatePlan(_name(target), plan_query(body, catalog, rank=rank, resident=resident, documents=False),
                          "append", "fail", columns)
    raise InvalidArgument(f"not a statement that changes tables: {tree.key.upper()}")


def _name(table: exp.Expression) -> str:
    if not isinstance(table, exp.Table) or table.args.get("db") or table.args.get("catalog"):
        raise InvalidArgument(f"name a table of the default schema{position(table)}")
    return table.name


def _empty_rows(schema: exp.Schema) -> exp.Select:
    """SELECT CAST(NULL AS type) AS column, ... WHERE FALSE: the rows of a table created empty."""
    columns = [c for c in schema.expressions if isinstance(c, exp.ColumnDef)]
    if not columns or len(columns) != len(schema.expressions):
        raise InvalidArgument(f"CREATE TABLE lists columns with their types{position(schema)}")
    return exp.select(*(exp.alias_(exp.cast(exp.null(), c.args["kind"]), c.name, quoted=True)
                        for c in columns)).where(exp.false())
