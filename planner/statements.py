"""From a statement's text to what runs it: a query's plan, a write, or a script of several statements.

- A statement without AI calls is DuckDB's. In the duckdb dialect it runs as
  written; in another it runs as sqlglot transpiles it, once, its unaliased
  result columns named by their expressions as written in that dialect.
  DuckDB's binder says whether it only reads (a query: its rows stream when
  they are fetched) or changes something (a `Write`: it runs when its call
  comes).
- A statement with AI calls is planned by Quail: a query by the AI planner
  (planner.py); an INSERT ... SELECT or CREATE TABLE ... AS by the AI planner
  for its query, the write reading that query's rows; any other statement
  (UPDATE, DELETE, ...) with its AI calls answered first (answers_first.py).
- A text of several statements is a `Script`: each is planned just before it
  runs, on one connection (the ones before may change what it reads).
- A view whose definition calls AI functions is Quail's (views.py): CREATE
  VIEW keeps it, DROP VIEW drops it, and a statement that reads it has its
  query in its place.
- `EXPLAIN [ANALYZE | (FORMAT ...)]` is Quail's own (explain.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence, Union

import sqlglot
from sqlglot import exp

from quail.engine.errors import InvalidArgument
from quail.engine.exec import sql_guard
from quail.engine.exec.catalog import RESERVED, AIView, Catalog
from quail.engine.exec.executor import result_schema
from quail.engine.exec.plan import ROWS, PhysicalPlan, SQLStep, Write
from quail.engine.exec.relational import DuckDB
from quail.engine.runtime.requests import ResidentShare
from quail.planner.ai_calls import ai_calls, ancestors
from quail.planner.binder import python_values, refuse_reserved
from quail.planner.dialects import DIALECTS, normalize, numbered_parameters, parse_statements, position
from quail.planner.embeddings import embeds, name_embedding_items, spell_embeddings
from quail.planner.explain import split_explain
from quail.planner.join_order import Rank, by_tokens
from quail.planner.planner import RESULT, answer_statement, name_columns, plan_query, plan_sql
from quail.planner.subqueries import reading
from quail.planner.views import definition as view_definition, drop as drop_view, expand, keep as keep_view
from quail.planner.views import mentions as views_mention

AI_CALL = re.compile(r"\bAI(?:_\w+|\s*\.\s*\w+)\s*\(", re.IGNORECASE)  # text that may call an AI function
READS = frozenset({"SELECT", "PRAGMA", "CALL"})  # statement kinds whose rows may stream when fetched
_AI_WRITES = (exp.Insert, exp.Create)  # statements whose AI calls may all stand in the query they write


@dataclass(frozen=True)
class Script:
    """Several statements in one text, run in order on one connection.

    Several statements in one text (each in the session's dialect), run in order on one connection. It binds
    no parameters, and what it returns is known only once it has run."""

    texts: tuple[str, ...]
    parameters: ClassVar[int] = 0
    returns_rows: ClassVar[bool] = False


Planned = Union[PhysicalPlan, Write, Script]


def plan_statement(sql: str, catalog: Catalog, dialect: str, params: Sequence[Any] | None = None,
                   rank: Rank = by_tokens, resident: ResidentShare | None = None) -> Planned:
    """What runs a statement's text; `params` are the values of its `?` placeholders (None: not bound yet, a
    statement prepared). Planned to run, AI steps do not carry the document tokens they expect resident;
    an EXPLAIN's do (it shows them)."""
    if split_explain(sql) is not None:
        return plan_sql(sql, catalog, dialect, params, rank=rank, resident=resident)
    if dialect == "duckdb" and not AI_CALL.search(sql):
        found = sql_guard.statements(sql)
        if not found:
            raise InvalidArgument("the text holds no SQL statement")
        if len(found) > 1:
            return Script(tuple(text for _, text in found))
        if found[0][0] == "TRANSACTION" or not _reads_views(sql, catalog):
            return _duckdb_statement(*found[0], catalog, params)
    trees = parse_statements(sql, dialect)
    if len(trees) > 1:
        return Script(tuple(tree.sql(DIALECTS[dialect]) for tree in trees))
    tree = trees[0]
    views = {} if isinstance(tree, (exp.Transaction, exp.Commit, exp.Rollback)) else catalog.ai_views()
    reads_views = bool(views) and views_mention(sql, views)
    dropped = drop_view(tree, views) if isinstance(tree, exp.Drop) else None
    if dropped is not None:
        return dropped
    if isinstance(tree, exp.Create) and (tree.args.get("kind") or "").upper() == "VIEW" and (
            reads_views or ai_calls(tree) or embeds(tree)):
        return _ai_view(tree, sql, catalog, dialect, views, rank, resident)
    if reads_views:
        expand(tree, views)
    spelled = spell_embeddings(tree, dialect, sql)
    if not ai_calls(tree):
        found = sql_guard.statements(sql if dialect == "duckdb" and not (reads_views or spelled) else
                                     numbered_parameters(normalize(name_columns(tree, dialect, sql, every=True))
                                                         ).sql("duckdb"))
        return _duckdb_statement(*found[0], catalog, params)
    tree = name_columns(tree, dialect, sql, every=dialect != "duckdb")
    if isinstance(tree, exp.Query):
        return plan_query(tree, catalog, params, rank=rank, resident=resident, documents=False)
    return _ai_write(tree, catalog, params, rank, resident)


def _reads_views(sql: str, catalog: Catalog) -> bool:
    """Whether a text may read a view with AI functions (planner/views.py; a transaction's BEGIN, COMMIT or
    ROLLBACK asks nothing of the catalog: a failed transaction can read nothing until it ends)."""
    views = catalog.ai_views()
    return bool(views) and views_mention(sql, views)


def _ai_view(tree: exp.Create, sql: str, catalog: Catalog, dialect: str, views: dict[str, AIView], rank: Rank,
             resident: ResidentShare | None) -> Write:
    """CREATE VIEW whose query calls AI or embedding functions (or reads such a view): the query planned now, so
    a view that cannot run is refused at once, and its definition kept (planner/views.py).

    - Its unaliased AI and embedding columns are named as written in `sql` and kept so named: the columns its
      schema lists are those a read of it returns.
    - Its embedding calls are spelled where it is read, so they take the reading statement's work and stop
      with it (a view DuckDB kept would hold a key of no statement)."""
    name_embedding_items(name_columns(tree, dialect, sql, every=dialect != "duckdb"), dialect, sql)
    view = view_definition(tree, catalog, dialect)
    query = expand(view.query.copy(), views)
    spell_embeddings(query, dialect, "")
    plan = plan_query(query, catalog, rank=rank, resident=resident, documents=False)
    if plan.parameters:
        raise InvalidArgument(f"a view's query takes no parameters{position(tree)}")
    return keep_view(view, result_schema(plan, catalog).serialize().to_pybytes(), views)


def _duckdb_statement(kind: str, text: str, catalog: Catalog, params: Sequence[Any] | None) -> PhysicalPlan | Write:
    """A statement DuckDB runs as it is: a query when it only reads, else a write (DuckDB's binder tells; a
    transaction's BEGIN, COMMIT or ROLLBACK is one without asking it, as it runs even where a failed statement
    has left its transaction unable to bind any other)."""
    if kind == "TRANSACTION":
        return Write(text, kind, False)
    lowered = text.lower()
    tables = tuple(name for name in catalog.relation_names() if name.lower() in lowered)
    target = None if kind in READS else _target(text)
    if kind in ("CREATE", "ALTER") and RESERVED in lowered:
        raise InvalidArgument(f"names starting with {RESERVED} are reserved: they are Quail's own")
    if target is not None and target.name.lower() in (name.lower() for name in tables):
        raise InvalidArgument(f"{target.name} is a system table: it cannot be written or dropped")
    relations = {name: table.schema.empty_table() for name, table in catalog.relations(tables).items()}
    values = None if params is None else python_values(params)
    with catalog.connection() as con, DuckDB(None, con) as db:
        signature = db.signature(text, relations, values)
    if kind in READS and signature.returns_rows and not signature.writes:
        return PhysicalPlan((SQLStep(text, RESULT, params=values or ()),), tables, RESULT, signature.parameters)
    return Write(text, kind, signature.returns_rows, signature.parameters, values, tables=tables,
                 target=target.sql("duckdb") if target is not None else None)


def _target(text: str) -> exp.Table | None:
    """The table a DuckDB statement creates, writes or drops (None: none, or the statement is beyond sqlglot)."""
    try:
        tree = sqlglot.parse_one(text, read="duckdb")
    except sqlglot.errors.SqlglotError:
        return None
    table = tree.this if isinstance(tree, (exp.Insert, exp.Update, exp.Delete, exp.Create, exp.Alter)) else \
        (tree.args.get("tables") or [None])[0] if isinstance(tree, exp.Drop) else None
    if isinstance(table, exp.Schema):
        table = table.this
    return table if isinstance(table, exp.Table) else None


def _ai_write(tree: exp.Expression, catalog: Catalog, params: Sequence[Any] | None, rank: Rank,
              resident: ResidentShare | None) -> Write:
    """A statement with AI calls that changes something: an INSERT or CREATE TABLE whose AI calls are all in the
    query it writes has that query planned by the AI planner, the statement reading its rows (ROWS); any
    other (UPDATE, DELETE, MERGE, ...) has its AI calls answered first (answers_first.py)."""
    refuse_reserved(tree)
    target = tree.this.this if isinstance(tree.this, exp.Schema) else tree.this
    if isinstance(tree, exp.Create) and (tree.args.get("kind") or "").upper() != "TABLE":
        raise InvalidArgument(f"AI functions in a CREATE {tree.args.get('kind')} are not supported"
                              f"{position(ai_calls(tree)[0])}")
    kind, returns_rows = tree.key.upper(), bool(tree.args.get("returning"))
    named = target.sql("duckdb") if isinstance(target, exp.Table) else None
    body = tree.expression if isinstance(tree, _AI_WRITES) else None
    if isinstance(body, exp.Values):
        body = body.replace(exp.select(exp.Star()).from_(exp.Subquery(this=body.copy())))
    if isinstance(body, exp.Query) and all(body in ancestors(call) for call in ai_calls(tree)):
        prelude = plan_query(body.copy(), catalog, params, rank=rank, resident=resident, documents=False,
                             result=ROWS)
        body.replace(reading(ROWS))
        return Write(tree.sql("duckdb"), kind, returns_rows, prelude.parameters, (), prelude, (ROWS,), target=named)
    answered = answer_statement(tree, catalog, params, rank=rank, resident=resident)
    prelude = PhysicalPlan(answered.steps, answered.tables, answered.reads[-1], answered.parameters)
    return Write(answered.tree.sql("duckdb"), kind, returns_rows, answered.parameters, (), prelude, answered.reads,
                 target=named)
