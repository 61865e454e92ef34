"""Views whose definitions call AI functions: kept by Quail, expanded into the statements that read them.

- DuckDB cannot hold such a view (it knows no AI function), so its
  definition is kept in the database's table VIEWS (name, query text, the
  dialect it was written in, its result schema), written and dropped in the
  same transaction as any other statement. A view that embeds (AI_EMBED,
  AI_SIMILARITY) is kept so too: spelled where it is read, its embeddings
  stop with the reading statement.
- A statement that reads one has the view's query put in its place, as a
  derived table under the view's name or alias, before it is planned: the AI
  work runs when the view is read, and the KV cache that outlives queries
  makes a second read over the same rows cheap. Views read views: expansion
  goes MAX_DEPTH deep at most.
- A view of the same name as a table or a DuckDB view is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp

from quail.engine.errors import AlreadyExists, InvalidArgument
from quail.engine.exec.catalog import AIView, Catalog
from quail.engine.exec.database import VIEWS
from quail.engine.exec.plan import Write
from quail.planner.dialects import DIALECTS, parse_statement, position

MAX_DEPTH = 16  # views reading views


@dataclass(frozen=True)
class ViewDefinition:
    """A CREATE VIEW with AI calls, as it will be kept.

    Its name, query text and dialect; `replace`: OR REPLACE,
    `keep`: IF NOT EXISTS."""

    name: str
    query: exp.Query
    dialect: str
    replace: bool
    keep: bool


def mentions(sql: str, views: dict[str, AIView]) -> bool:
    """Whether a text may read one of the views (a name of one stands in it as a word)."""
    lowered = sql.lower()
    return any(re.search(rf"(?<![\w$]){re.escape(name)}(?![\w$])", lowered) for name in views)


def expand(tree: exp.Expression, views: dict[str, AIView], depth: int = 0) -> exp.Expression:
    """The statement (rewritten in place) with each read of a view replaced by the view's query, aliased as the
    reference was (a CTE of the same name is not a view)."""
    if depth > MAX_DEPTH:
        raise InvalidArgument(f"views read views more than {MAX_DEPTH} deep")
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for table in list(tree.find_all(exp.Table)):
        view = views.get(table.name.lower())
        if view is None or table.db or table.name.lower() in ctes or isinstance(table.parent, exp.Schema):
            continue
        body = expand(parse_statement(view.sql, view.dialect), views, depth + 1)
        alias = table.alias_or_name
        table.replace(exp.Subquery(this=body, alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True))))
    return tree


def definition(tree: exp.Create, catalog: Catalog, dialect: str) -> ViewDefinition:
    """A CREATE VIEW statement's view, checked against the catalog: no table or DuckDB view of its name."""
    target = tree.this.this if isinstance(tree.this, exp.Schema) else tree.this
    if isinstance(tree.this, exp.Schema) or target.db or not isinstance(tree.expression, exp.Query):
        raise InvalidArgument(f"a view with AI functions is named in the main schema and defined by a query, "
                              f"its columns named there{position(tree)}")
    if catalog.has(target.name) and target.name.lower() not in catalog.ai_views():
        raise AlreadyExists(f"{target.name!r} is a table or view of the database already")
    return ViewDefinition(target.name, tree.expression, dialect, bool(tree.args.get("replace")),
                          bool(tree.args.get("exists")))


def keep(view: ViewDefinition, schema: bytes, views: dict[str, AIView]) -> Write:
    """The write keeping a view's definition (its result schema serialized)."""
    if view.name.lower() in views and not view.replace:
        if view.keep:
            return Write(f"SELECT count(*) AS Count FROM {VIEWS} WHERE false", "CREATE", False)
        raise AlreadyExists(f"view {view.name!r} already exists")
    return Write(f"INSERT OR REPLACE INTO {VIEWS} VALUES (?, ?, ?, ?, ?)", "CREATE", False, 0,
                 (view.name.lower(), view.name, view.query.sql(DIALECTS[view.dialect]), view.dialect, schema))


def drop(tree: exp.Drop, views: dict[str, AIView]) -> Write | None:
    """The write dropping a view kept here (None: the statement drops no such view)."""
    tables = tree.args.get("tables") or [tree.this]
    if (tree.args.get("kind") or "").upper() != "VIEW" or len(tables) != 1 or not isinstance(tables[0], exp.Table) \
            or tables[0].name.lower() not in views:
        return None
    return Write(f"DELETE FROM {VIEWS} WHERE key = ?", "DROP", False, 0, (tables[0].name.lower(),))
