"""AI calls anywhere an expression stands: each call's answers computed first, then the statement as DuckDB runs it.

- An AI call is a function of the columns it reads: its prompt depends only
  on the query text and the row values. So its answers can be asked first,
  once per distinct combination of those columns' values, by the AI planner
  (a query `SELECT cols, call FROM (SELECT DISTINCT cols FROM source) ...`),
  and the call replaced by the lookup of its answer: a correlated scalar
  subquery over those answers, which DuckDB runs as a join.
- The combinations asked are those of the tables the call reads, all their
  rows, or those that pass the conditions its statement's WHERE puts on that
  table alone, where nothing joins it outward: a superset of the rows DuckDB
  evaluates the call on, so each lookup finds its answer.
- It serves what the AI core of a SELECT cannot express (planner.py): UPDATE
  and DELETE, AI calls under NOT or OR in a grouped query, in FILTER clauses,
  in an outer join's condition other than a bare AI_FILTER conjunct. The
  answers are the ones the same query would give in two steps: its AI
  answers materialized first, then the query over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from sqlglot import exp

from quail.engine.errors import InvalidArgument
from quail.engine.exec.catalog import Catalog
from quail.engine.exec.plan import PhysicalPlan, Step
from quail.planner.ai_calls import AGGREGATES, ai_calls, ai_name, ancestors, contains_ai
from quail.planner.binder import bind_parameters, bind_tables
from quail.planner.dialects import normalize, position
from quail.planner.subqueries import Names, Scope, ctes_of, source_columns

ANSWER = "__quail_answer"
KEY = "__quail_key_{}"
_OWNERS = (exp.Select, exp.Update, exp.Delete)
PlanQuery = Callable[[exp.Expression, Names, str], PhysicalPlan]  # an answers query, its names, its result: its plan


@dataclass(frozen=True)
class Answered:
    """A statement with each AI call replaced by the lookup of its answer.

    `steps` compute the answers into the
    relations named `reads`; `tables`: the stored tables the statement reads; `parameters`: its `?` count."""

    tree: exp.Expression
    steps: tuple[Step, ...]
    reads: tuple[str, ...]
    tables: tuple[str, ...]
    parameters: int


def needs_answers_first(tree: exp.Expression) -> bool:
    """Whether a query has an AI call in an outer join's condition other than as a bare AI_FILTER conjunct of it
    (which the AI core plans as the condition of a join that keeps its unmatched rows: planner.py)."""
    for call in ai_calls(tree):
        path = [call]
        for parent in ancestors(call):
            if isinstance(parent, exp.Select):
                break
            if isinstance(parent, exp.Join):
                if path[-1] is parent.args.get("on") and parent.args.get("side"):
                    bare = ai_name(call) in ("AI_FILTER", "AI.IF") and all(isinstance(n, exp.And) for n in path[1:])
                    if not bare:
                        return True
                break
            path.append(parent)
    return False


def answer_first(tree: exp.Expression, catalog: Catalog, params: Sequence[Any] | None, names: Names,
                 plan_query: PlanQuery) -> Answered:
    """The statement (rewritten in place) with its AI calls answered first; `plan_query` plans each call's
    answers query."""
    tables = bind_tables(tree, catalog)
    parameters = bind_parameters(tree, params)
    normalize(tree)
    scope = Scope(catalog)
    steps: list[Step] = []
    reads: list[str] = []
    for call in [c for c in ai_calls(tree) if not any(ai_name(a) for a in ancestors(c))]:
        if ai_name(call) in AGGREGATES:
            raise InvalidArgument(f"{ai_name(call)} must be a column of a SELECT by itself{position(call)}")
        _check_per_row(call)
        name = names.fresh("answers")
        columns = _columns(call)
        steps += plan_query(_answers_query(call, columns, tree, scope), names, name).steps
        reads.append(name)
        call.replace(_lookup(name, columns, names.fresh("a")))
    return Answered(tree, tuple(steps), tuple(reads), tables, parameters)


def _check_per_row(call: exp.Expression) -> None:
    """InvalidArgument for a call a grouped SELECT evaluates per group (in its columns, HAVING or ORDER BY, outside
    an aggregate): its columns are the group's, which the AI core binds (planner/emit.py)."""
    owner = next((a for a in ancestors(call) if isinstance(a, _OWNERS)), None)
    if not isinstance(owner, exp.Select) or not (owner.args.get("group") or owner.find(exp.AggFunc)):
        return
    path = list(ancestors(call))
    within = path[:path.index(owner)]
    if not any(isinstance(node, (exp.AggFunc, exp.Where)) for node in within):
        raise InvalidArgument(f"{ai_name(call)} in a grouped SELECT reads its rows per group: here only as the "
                              f"AI core binds it{position(call)}")


def _columns(call: exp.Expression) -> list[exp.Column]:
    """The distinct columns an AI call reads, in the order it first reads them."""
    found: dict[tuple[str, str], exp.Column] = {}
    for column in call.find_all(exp.Column):
        if not isinstance(column.this, exp.Star):
            found.setdefault((column.table.lower(), column.name.lower()), column)
    if not found:
        raise InvalidArgument(f"{ai_name(call)} asks nothing of the rows: give it a column in its prompt"
                              f"{position(call)}")
    return list(found.values())


def _answers_query(call: exp.Expression, columns: list[exp.Column], root: exp.Expression,
                   scope: Scope) -> exp.Select:
    """SELECT each column AS key i, the call AS ANSWER FROM one derived table per source the call reads: its
    distinct values of those columns, where the statement's WHERE conditions on it alone hold (when no join
    keeps unmatched rows)."""
    owner = next((a for a in ancestors(call) if isinstance(a, _OWNERS)), None)
    if owner is None:
        raise InvalidArgument(f"{ai_name(call)} stands outside a SELECT, UPDATE or DELETE{position(call)}")
    sources = _sources(owner)
    read: dict[str, list[str]] = {}
    for column in columns:
        alias = _source_of(column, sources, root, scope)
        if column.name not in read.setdefault(alias, []):
            read[alias].append(column.name)
    conditions = _pushable(owner, sources, root, scope)
    query = exp.select(*(exp.alias_(column.copy(), KEY.format(i), quoted=True) for i, column in enumerate(columns)),
                       exp.alias_(call.copy(), ANSWER, quoted=True))
    for k, (alias, names) in enumerate(read.items()):
        values = exp.select(*(exp.column(name, table=alias, quoted=True) for name in names)).distinct() \
            .from_(sources[alias].copy())
        for condition in conditions.get(alias, []):
            values = values.where(condition.copy())
        derived = exp.Subquery(this=values, alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))
        query = query.from_(derived) if k == 0 else query.join(derived, join_type="cross")
    if ctes_of(root):
        query.set("with_", root.args["with_"].copy())
    return query


def _sources(owner: exp.Expression) -> dict[str, exp.Expression]:
    """The tables (and derived tables) an owner statement reads, by alias, lower-case."""
    if isinstance(owner, exp.Select):
        found = [owner.args["from_"].this] if owner.args.get("from_") else []
        found += [join.this for join in owner.args.get("joins") or []]
    else:
        found = [owner.this]
        extra = owner.args.get("from_") if isinstance(owner, exp.Update) else None
        found += [extra.this] if extra is not None else list(owner.args.get("using") or [])
    return {source.alias_or_name.lower(): source for source in found}


def _source_of(column: exp.Column, sources: dict[str, exp.Expression], root: exp.Expression, scope: Scope) -> str:
    """The alias of the source a column of an AI call belongs to; InvalidArgument for one of an outer query or
    of no source, or a name several sources have."""
    if column.table:
        if column.table.lower() not in sources:
            raise InvalidArgument(f"an AI call here reads {column.sql()}, a column of an outer query: not "
                                  f"supported yet{position(column)}")
        return column.table.lower()
    having = [alias for alias, source in sources.items()
              if column.name.lower() in (c.lower() for c in source_columns(source, scope, ctes_of(root)))]
    if len(having) != 1:
        raise InvalidArgument(f"column {column.name!r} is {'in several sources' if having else 'in no source'} "
                              f"of the statement that calls AI on it{position(column)}")
    return having[0]


def _pushable(owner: exp.Expression, sources: dict[str, exp.Expression], root: exp.Expression,
              scope: Scope) -> dict[str, list[exp.Expression]]:
    """The owner's WHERE conjuncts without AI calls or subqueries that read one source alone, by its alias;
    none where a join of the owner keeps unmatched rows."""
    where = owner.args.get("where")
    joins = owner.args.get("joins") or []
    if where is None or any(join.args.get("side") for join in joins):
        return {}
    found: dict[str, list[exp.Expression]] = {}
    conjuncts = where.this.flatten() if isinstance(where.this, exp.And) else [where.this]
    for conjunct in conjuncts:
        if contains_ai(conjunct) or conjunct.find(exp.Query) is not None:
            continue
        try:
            aliases = {_source_of(column, sources, root, scope) for column in conjunct.find_all(exp.Column)}
        except InvalidArgument:
            continue
        if len(aliases) == 1:
            found.setdefault(aliases.pop(), []).append(conjunct)
    return found


def _lookup(relation: str, columns: list[exp.Column], alias: str) -> exp.Subquery:
    """(SELECT ANSWER FROM relation AS alias WHERE alias.key_i IS NOT DISTINCT FROM column_i AND ...)"""
    keys = [exp.NullSafeEQ(this=exp.column(KEY.format(i), table=alias, quoted=True), expression=column.copy())
            for i, column in enumerate(columns)]
    query = exp.select(exp.column(ANSWER, quoted=True)).from_(
        exp.Table(this=exp.to_identifier(relation, quoted=True), alias=exp.TableAlias(this=exp.to_identifier(alias))))
    return exp.Subquery(this=query.where(exp.and_(*keys)))
