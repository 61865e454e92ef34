"""From SQL text to a physical plan: parse, bind, then each SELECT's AI core bound, rewritten and emitted.

core.py binds a SELECT's AI core, the rules in rules/ rewrite it, emit.py turns
it into steps.

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

from typing import Any, Sequence

from sqlglot import exp

from quail.engine.errors import InvalidArgument
from quail.engine.exec.catalog import Catalog
from quail.engine.exec.plan import AIAggregate, PhysicalPlan, SQLStep, Step
from quail.engine.runtime.requests import ResidentShare
from quail.planner.aggregates import collect_texts
from quail.planner.answers_first import Answered, answer_first, needs_answers_first
from quail.planner.ai_calls import ai_calls, contains_ai
from quail.planner.binder import bind_parameters, bind_tables, refuse_reserved
from quail.planner.core import bind_core
from quail.planner.correlated import decorrelate
from quail.planner.dialects import DEFAULT_DIALECT, DIALECTS, normalize, parse_statement, position, written_items
from quail.planner.embeddings import spell_embeddings
from quail.planner.emit import aliased_table, emit
from quail.planner.explain import explain_plan, split_explain
from quail.planner.join_order import Rank, by_tokens
from quail.planner.rules import RULES, Rule, optimize
from quail.planner.streaming import stream_in_chunks
from quail.planner.subqueries import Names, Scope, ctes_of, innermost_ai_select, output_columns, reading, sources
from quail.planner.views import expand

RESULT = "__quail_result"
ANSWERED_FIRST = ("AI calls answered first: each asked once per distinct value of the columns it reads, the query "
                  "then run in DuckDB over those answers")


def plan_sql(sql: str, catalog: Catalog, dialect: str = DEFAULT_DIALECT,
             params: Sequence[Any] | None = None, join_order: Sequence[str] | None = None,
             rank: Rank = by_tokens, rules: tuple[Rule, ...] = RULES,
             resident: ResidentShare | None = None) -> PhysicalPlan:
    """The physical plan of one query; params bind its `?` placeholders (None binds NULLs).

    `EXPLAIN <query>` plans the query and returns a plan listing its steps;
    `EXPLAIN ANALYZE <query>` a plan that runs it and reports what each step did;
    `EXPLAIN (FORMAT SUBSTRAIT) <query>` one returning its Substrait plan (one binary value).
    join_order forces the order (table aliases) in which the query's AI core
    joins its tables, instead of the cheapest (tests and comparisons); `rank`
    prices a join order's model work (cost.rank_by_sol: the speed of light on
    the serving device; default: tokens); `rules` are the planner's rules to
    apply, in order (planner/rules/: without one, the plan asks the model as
    the query is written); `resident` tells what share of a column's
    documents the KV pool holds now (Runtime.resident_share: join orders
    count those tokens as read, not computed, and EXPLAIN shows the document
    tokens each AI step expects resident; None: every document computed).
    """
    explained = split_explain(sql)
    if explained is not None:
        inner, mode = explained
        return explain_plan(plan_sql(inner, catalog, dialect, params, join_order, rank, rules, resident), mode,
                            catalog)
    tree = expand(parse_statement(sql, dialect), catalog.ai_views())
    spell_embeddings(tree, dialect, sql)
    return plan_query(name_columns(tree, dialect, sql, every=dialect != "duckdb"), catalog, params, join_order, rank,
                      rules, resident)


def plan_query(tree: exp.Expression, catalog: Catalog, params: Sequence[Any] | None = None,
               join_order: Sequence[str] | None = None, rank: Rank = by_tokens,
               rules: tuple[Rule, ...] = RULES, resident: ResidentShare | None = None,
               documents: bool = True, result: str = RESULT) -> PhysicalPlan:
    """plan_sql over a parsed statement (which it rewrites in place): a query, else INVALID_ARGUMENT; its rows in
    the relation `result`. `documents`: each AI step carries the document tokens it expects resident (which
    EXPLAIN shows; False spares a plan that runs at once the look into the pool, join orders still priced
    with it). A query whose AI calls the AI core cannot place (one in an outer join's condition other than
    a bare AI_FILTER conjunct; one the core refuses to plan) has them answered first (answers_first.py)."""
    if not isinstance(tree, exp.Query):
        raise InvalidArgument(f"only queries are supported here, not {tree.key.upper()} statements")
    refuse_reserved(tree)
    if needs_answers_first(tree):
        return _answered(answer_statement(tree, catalog, params, rank, rules, resident, documents), result)
    original = tree.copy()
    try:
        return _plan_core(tree, catalog, params, join_order, rank, rules, resident, documents, Names(), result)
    except InvalidArgument as refused:
        if not ai_calls(original):
            raise
        try:
            return _answered(answer_statement(original, catalog, params, rank, rules, resident, documents), result)
        except InvalidArgument:
            raise refused from None


def answer_statement(tree: exp.Expression, catalog: Catalog, params: Sequence[Any] | None = None,
                     rank: Rank = by_tokens, rules: tuple[Rule, ...] = RULES, resident: ResidentShare | None = None,
                     documents: bool = False) -> Answered:
    """A statement of any kind (rewritten in place) with its AI calls answered first (answers_first.py), each
    call's answers query planned by the AI core."""
    return answer_first(tree, catalog, params, Names(), lambda query, names, output: _plan_core(
        query, catalog, None, None, rank, rules, resident, documents, names, output))


def _answered(answered: Answered, result: str) -> PhysicalPlan:
    """A query whose AI calls were answered first: their answers' steps, then the query in DuckDB."""
    steps = answered.steps + (SQLStep(answered.tree.sql("duckdb"), result),)
    return PhysicalPlan(steps, answered.tables, result, answered.parameters, (ANSWERED_FIRST,))


def _plan_core(tree: exp.Query, catalog: Catalog, params: Sequence[Any] | None, join_order: Sequence[str] | None,
               rank: Rank, rules: tuple[Rule, ...], resident: ResidentShare | None, documents: bool, names: Names,
               result: str) -> PhysicalPlan:
    """A query planned around the AI core of each of its SELECTs (the module's docstring), its relations named
    by `names`."""
    tables = bind_tables(tree, catalog)
    parameters = bind_parameters(tree, params)
    normalize(tree)
    scope, steps, notes = Scope(catalog, resident=resident, documents=documents), [], []
    while (inner := innermost_ai_select(tree)) is not None:
        name = names.fresh("sub")
        correlated = decorrelate(inner, scope.has)
        steps += _plan_select(inner, tree, scope, names, name, notes, rank, None, rules)
        if correlated is not None:
            correlated.predicate.replace(correlated.reader(name))
        else:
            inner.replace(reading(name))
    if ai_calls(tree):
        steps += _plan_select(tree, tree, scope, names, result, notes, rank, join_order, rules)
    else:
        steps.append(SQLStep(tree.sql("duckdb"), result))
    return stream_in_chunks(PhysicalPlan(tuple(steps), tables, result, parameters, tuple(notes)))


def name_columns(tree: exp.Expression, dialect: str, sql: str, every: bool = False) -> exp.Expression:
    """The parsed statement with unaliased result columns named by their expressions as written (as DuckDB and
    Snowflake name an expression's column): those with AI functions in every SELECT, so the plan's column
    computing one never names it; with `every` (a dialect other than DuckDB's, whose statements DuckDB runs
    transpiled), also each expression of the outermost SELECT. The outermost SELECT's names are the text's
    own; deeper ones, as the dialect writes them."""
    outer = tree.find(exp.Select)
    written = written_items(sql, dialect)
    for select in list(tree.find_all(exp.Select)):
        texts = written if select is outer and len(written) == len(select.expressions) else None
        for k, item in enumerate(list(select.expressions)):
            if isinstance(item, (exp.Alias, exp.Star, exp.Column)) or not (contains_ai(item) or
                                                                           (every and select is outer)):
                continue
            name = texts[k] if texts is not None else item.sql(DIALECTS[dialect])
            item.replace(exp.alias_(item.copy(), name, quoted=True))
    return tree


def _plan_select(select: exp.Query, root: exp.Query, scope: Scope, names: Names, result: str, notes: list[str],
                 rank: Rank, join_order: Sequence[str] | None, rules: tuple[Rule, ...]) -> list[Step]:
    """Steps computing one SELECT with AI calls into `result`: its AI core bound, rewritten by the rules and
    emitted (with AI aggregates: the SELECT collecting their texts, then the aggregate step: aggregates.py);
    its columns join the scope, the rules' notes join `notes`."""
    if not isinstance(select, exp.Select) or select.args.get("from_") is None:
        raise InvalidArgument(f"an AI function outside a SELECT ... FROM is not supported yet"
                              f"{position(ai_calls(select)[0])}")
    aggregated = collect_texts(select)
    steps = _materialize_sources(select, root, scope, names)
    texts = names.fresh("texts") if aggregated else result
    scope.add(texts, output_columns(select, scope))
    if ai_calls(select):
        core = optimize(bind_core(select, scope, rank, join_order), rules)
        notes += core.notes
        steps += emit(core, names, texts)
    else:
        steps.append(SQLStep(select.sql("duckdb"), texts))
    if aggregated:
        scope.add(result, output_columns(select, scope))
        steps.append(AIAggregate(texts, result, tuple(aggregated)))
    return steps


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
        source.replace(aliased_table(name, source.alias_or_name))
    return steps
