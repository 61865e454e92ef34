"""AI work inside CTEs, derived tables and subqueries: each such SELECT is planned on its own, first.

The innermost SELECT holding AI calls is planned like a top-level query and its
result materialized under a fresh name; in the tree it becomes
`SELECT * FROM <name>`, so every reader (an outer FROM, a CTE, an IN list, a
scalar subquery, a UNION branch) sees a relation. When the outer query still
asks the model, its FROM sources that are not stored tables are materialized
too, so the outer AI core plans over relations with known columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from quail.engine.errors import InvalidArgument
from quail.engine.exec.catalog import Catalog
from quail.engine.runtime.requests import ResidentShare

from quail.planner.ai_calls import ai_name, ancestors
from quail.planner.dialects import position

CHARS_SAMPLE = 256  # rows read to estimate a column's mean length


@dataclass
class Names:
    """Fresh names for a query's intermediate relations, shared by every SELECT planned in it."""

    count: int = 0

    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"__quail_{stem}_{self.count}"


@dataclass
class Scope:
    """The catalog seen by one SELECT.

    Stored tables plus the relations materialized before it; `resident`
    answers what share of a column's documents the KV pool holds (None: the planner does not see the pool);
    `documents`: whether AI steps carry the document tokens they expect resident (EXPLAIN's figure)."""

    catalog: Catalog
    columns: dict[str, list[str]] = field(default_factory=dict)
    _chars: dict[tuple[str, str], float | None] = field(default_factory=dict)  # mean_chars, each column read once
    resident: ResidentShare | None = None
    _resident: dict[tuple[str, str, int], float] = field(default_factory=dict)  # resident_share, asked once each
    documents: bool = True

    def has(self, name: str) -> bool:
        return name.lower() in self.columns or self.catalog.has(name)

    def schema(self, name: str) -> pa.Schema:
        if name.lower() in self.columns:
            return pa.schema([(c, pa.null()) for c in self.columns[name.lower()]])
        return self.catalog.schema(name)

    def add(self, name: str, columns: list[str]) -> None:
        self.columns[name.lower()] = columns

    def rows(self, name: str) -> int | None:
        """A stored table's row count (None for a relation not materialized yet)."""
        return None if name.lower() in self.columns else self.catalog.rows(name)

    def mean_chars(self, name: str, column: str) -> float | None:
        """The mean length in characters of a stored table's column as text (None when unknown), estimated
        from at most CHARS_SAMPLE rows evenly spaced (the same every time): planning a statement over a
        few rows of a large table reads a few of them."""
        key = (name.lower(), column.lower())
        if key not in self._chars:
            self._chars[key] = self._mean_chars(name, column)
        return self._chars[key]

    def _mean_chars(self, name: str, column: str) -> float | None:
        texts = self._stored(name, column)
        if texts is None or len(texts) == 0:
            return None
        step = -(-len(texts) // CHARS_SAMPLE)  # rounded up: at most CHARS_SAMPLE rows
        sample = pa.chunked_array([chunk for row in range(0, len(texts), step) for chunk in texts.slice(row, 1).chunks],
                                  texts.type)
        return pc.mean(pc.utf8_length(sample.cast(pa.string()))).as_py() or 0.0

    def resident_share(self, name: str, column: str, placeholder: int) -> float:
        """The share of the tokens of a stored table's column's documents, as placeholder {placeholder}'s,
        resident in the KV pool now (`resident`, asked once per column and placeholder; 0 without it, or for
        a relation materialized in this query)."""
        key = (name.lower(), column.lower(), placeholder)
        if key not in self._resident:
            texts = self._stored(name, column) if self.resident is not None else None
            self._resident[key] = 0.0 if texts is None else self.resident(texts, placeholder)
        return self._resident[key]

    def _stored(self, name: str, column: str) -> pa.ChunkedArray | None:
        """A stored table's column (None for a relation materialized in this query, or no such column)."""
        return None if name.lower() in self.columns else self.catalog.column(name, column)


def sources(select: exp.Select) -> list[exp.Expression]:
    """The FROM and JOIN sources of a SELECT."""
    found = [select.args["from_"].this] if select.args.get("from_") else []
    return found + [j.this for j in select.args.get("joins") or []]


def innermost_ai_select(root: exp.Expression) -> exp.Select | None:
    """A SELECT below the root whose AI calls are its own (in no deeper SELECT), or None."""
    for node in root.walk():
        if ai_name(node):
            owner = next((a for a in ancestors(node) if isinstance(a, exp.Select)), None)
            if owner is not None and owner is not root:
                return owner
    return None


def reading(name: str) -> exp.Select:
    """`SELECT * FROM name`: what replaces a materialized SELECT in the tree."""
    return exp.select(exp.Star()).from_(exp.Table(this=exp.to_identifier(name, quoted=True)))


def output_columns(select: exp.Query, scope: Scope) -> list[str]:
    """The column names a SELECT returns, stars expanded over its FROM sources."""
    if not isinstance(select, exp.Select):
        return output_columns(select.this, scope) if isinstance(select, exp.SetOperation) else []
    out: list[str] = []
    for item in select.expressions:
        star_of = item.table if isinstance(item, exp.Column) and isinstance(item.this, exp.Star) else None
        if isinstance(item, exp.Star) or star_of is not None:
            for source in sources(select):
                if star_of and source.alias_or_name.lower() != star_of.lower():
                    continue
                out += source_columns(source, scope)
        elif item.output_name:
            out.append(item.output_name)
    return out


def source_columns(source: exp.Expression, scope: Scope, ctes: dict[str, exp.CTE] | None = None) -> list[str]:
    """The columns a FROM source offers: a CTE's of `ctes` (a statement's WITH, by lower-case name), a stored or
    materialized table's, a derived table's."""
    if ctes and isinstance(source, exp.Table) and not source.db and source.name.lower() in ctes:
        return output_columns(ctes[source.name.lower()].this, scope)
    if isinstance(source, exp.Table) and scope.has(source.name):
        return list(scope.schema(source.name).names)
    if isinstance(source, exp.Subquery):
        return output_columns(source.this, scope)
    raise InvalidArgument(f"cannot tell the columns of {source.sql()}{position(source)}")


def ctes_of(root: exp.Query) -> dict[str, exp.CTE]:
    with_ = root.args.get("with_")
    return {cte.alias_or_name.lower(): cte for cte in (with_.expressions if with_ else [])}
