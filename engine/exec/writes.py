"""Statements that change the database, run by DuckDB on the catalog's connection.

- A write's AI work (its prelude) runs first, through the executor; the
  relations the statement reads of it (its rows to insert, or its AI calls'
  answers) are registered for the statement.
- Several writes (one statement, once per row of parameters) run in one
  transaction when the connection is not in one already: all or nothing.
- The result is the last write's RETURNING rows, or one row: the rows the
  writes changed, summed.
"""

from __future__ import annotations

import pyarrow as pa

from quail.engine.errors import QuailError
from quail.engine.exec.catalog import Catalog
from quail.engine.exec.executor import empty_relations, run_steps, statements
from quail.engine.exec.plan import Write
from quail.engine.exec.relational import DuckDB
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.runtime import Runtime

UPDATE_SCHEMA = pa.schema([pa.field("rows_affected", pa.int64(), nullable=False)])


def write_schema(write: Write, catalog: Catalog) -> pa.Schema:
    """What running the write returns: its RETURNING columns (bound, nothing run), else UPDATE_SCHEMA."""
    if not write.returns_rows:
        return UPDATE_SCHEMA
    relations = {name: table.schema.empty_table() for name, table in catalog.relations(write.tables).items()}
    if write.prelude is not None:
        made = empty_relations(write.prelude, catalog)
        relations |= {name: made[name] for name in write.reads}
    with catalog.connection() as con, DuckDB(None, con) as db:
        return db.schema(write.sql, relations)


def run_writes(writes: list[Write], catalog: Catalog, runtime: Runtime | None, work: QueryWork,
               atomic: bool) -> pa.Table:
    """Run the writes in order; `atomic`: in one transaction of their own (the connection is in none)."""
    returned, changed = None, 0
    with statements(catalog, work, runtime) as db:
        if atomic:
            db.run("BEGIN", {})
        try:
            for write in writes:
                relations = catalog.relations(write.tables)
                if write.prelude is not None:
                    made = run_steps(write.prelude, catalog, runtime, work)
                    relations |= {name: made[name] for name in write.reads}
                returned = db.run(write.sql, relations, write.params)
                if not write.returns_rows and returned.num_columns == 1 and returned.num_rows == 1 and \
                        returned.schema.names == ["Count"]:
                    changed += returned.column(0)[0].as_py() or 0
            if atomic:
                work.check()  # cancelled after its last statement (its call ended): DuckDB would run the COMMIT
                db.run("COMMIT", {})
        except BaseException:
            if atomic:
                _roll_back(db)
            raise
    return returned if writes[-1].returns_rows else changed_rows(changed)


def changed_rows(rows: int) -> pa.Table:
    """The result of a statement that changed `rows` rows (UPDATE_SCHEMA)."""
    return pa.Table.from_pydict({"rows_affected": [rows]}, schema=UPDATE_SCHEMA)


def _roll_back(db: DuckDB) -> None:
    """End the writes' own transaction after an error (none may be open: the error was its BEGIN's)."""
    try:
        db.run("ROLLBACK", {})
    except QuailError:
        pass
