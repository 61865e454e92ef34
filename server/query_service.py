"""One statement planned and run: what the Flight SQL handler and the in-process Session share.

A statement is planned (its join orders priced by the speed of light on the
serving device, where one is named, counting the documents the runtime's KV
pool holds as read, not computed), its result schema found, then run to a
table or a stream of batches, and reported with its speed of light.

Statements plan one at a time, in about the order they came (`QueryService.turn`).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa

from quail.engine.exec.catalog import Catalog
from quail.engine.exec.executor import execute, execute_stream, result_schema
from quail.engine.exec.plan import PhysicalPlan, Write
from quail.engine.exec.relational import StatementSchemas
from quail.engine.exec.writes import write_schema
from quail.engine.model.config import EngineConfig
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.runtime import Runtime
from quail.planner.cost import DEVICES, rank_by_sol, sol_seconds
from quail.planner.planner import plan_sql
from quail.planner.statements import Planned, Script, plan_statement
from quail.planner.substrait.consumer import import_plan
from quail.planner.substrait.producer import export_plan


PLAN_PATIENCE_S = 0.2  # the longest a statement waits for its turn to plan
SCHEMA_WAIT_S = 0.05  # the longest a started query's result schema waits for its first pass to be under way


@dataclass
class QueryService:
    """Plans statements over a catalog and runs them on one runtime.

    `sol_device` names the device constants (planner/cost.py) that price join
    orders and give reports their speed of light, `replicas` how many such
    devices serve the model (the speed of light spreads the work over them);
    None: join orders priced by tokens, no speed of light. `schemas` remembers the output schemas of the
    DuckDB statements whose result schemas it found (relational.StatementSchemas).
    """

    runtime: Runtime
    sol_device: str | None = None
    precision: str = "fp32"
    token_budget: int = 4096
    replicas: int = 1
    schemas: StatementSchemas = field(default_factory=StatementSchemas)
    planning: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def serving(cls, runtime: Runtime, config: EngineConfig) -> "QueryService":
        """The service of a runtime loaded with `config`."""
        return cls(runtime, config.speed_of_light_device, config.precision, config.token_budget, config.replicas or 1)

    def sol(self, ideal: Stats) -> float | None:
        """Speed-of-light seconds of the ideal work on the serving device (None: no device named)."""
        if self.sol_device is None:
            return None
        return sol_seconds(ideal, self.runtime.config, DEVICES[self.sol_device], self.precision, self.token_budget,
                           self.replicas)

    @contextmanager
    def turn(self) -> Iterator[None]:
        """A statement's turn to plan. Planning is Python under the interpreter's lock: statements planned
        side by side all finish about when the last would have, the device idle until then, while one at a
        time, the first runs as the others plan. A statement waits at most PLAN_PATIENCE_S for its turn, then
        plans beside the one planning: a plan that takes seconds (a condition of thousands of terms) holds
        the others up no longer."""
        mine = self.planning.acquire(timeout=PLAN_PATIENCE_S)
        try:
            yield
        finally:
            if mine:
                self.planning.release()

    def plan(self, text: str, catalog: Catalog, dialect: str, params: Sequence[Any] | None = None,
             work: QueryWork | None = None, started: Callable[[PhysicalPlan], threading.Event | None] | None = None
             ) -> tuple[Planned, pa.Schema | None]:
        """A statement's plan and result schema (a write's: its RETURNING rows or its count of rows changed;
        None for a text of several statements, whose result is the last one's); finding a query's schema
        stops when `work` is cancelled or passes its deadline. `started` is
        given a query's plan before its result schema is found (the server starts it from there), and may
        give back an event that finding the schema waits for first, at most SCHEMA_WAIT_S and out of the
        planning turn: the started query's first pass is under way (QueryWork.under_way) before the schema's
        work takes the interpreter from it."""
        with self.turn():
            plan = plan_statement(text, catalog, dialect, params, rank_by_sol(self.sol), self.runtime.resident_share)
            if work is not None:
                work.check()
            if isinstance(plan, Write):
                return plan, write_schema(plan, catalog)
            if isinstance(plan, Script):
                return plan, None
            under_way = started(plan) if started is not None else None
            if under_way is None:
                return plan, result_schema(plan, catalog, work, self.schemas)
        under_way.wait(SCHEMA_WAIT_S)
        with self.turn():
            return plan, result_schema(plan, catalog, work, self.schemas)

    def plan_query(self, text: str, catalog: Catalog, dialect: str,
                   params: Sequence[Any] | None = None) -> tuple[PhysicalPlan, pa.Schema]:
        """A query's plan and result schema."""
        with self.turn():
            plan = plan_sql(text, catalog, dialect, params, rank=rank_by_sol(self.sol),
                            resident=self.runtime.resident_share)
            return plan, result_schema(plan, catalog, schemas=self.schemas)

    def plan_substrait(self, plan: bytes, catalog: Catalog) -> tuple[PhysicalPlan, pa.Schema]:
        """A serialized Substrait plan's physical plan and result schema."""
        with self.turn():
            physical = import_plan(plan, catalog, rank_by_sol(self.sol), self.runtime.resident_share)
            return physical, result_schema(physical, catalog, schemas=self.schemas)

    def substrait(self, text: str, catalog: Catalog, dialect: str, params: Sequence[Any] | None = None) -> bytes:
        """A query's optimized plan as a serialized Substrait plan."""
        with self.turn():
            plan = plan_sql(text, catalog, dialect, params, rank=rank_by_sol(self.sol),
                            resident=self.runtime.resident_share)
            return export_plan(plan, catalog).SerializeToString()

    def execute(self, plan: PhysicalPlan, catalog: Catalog, work: QueryWork) -> pa.Table:
        """The query's rows; its model work recorded in `work`."""
        return execute(plan, catalog, self.runtime, work, self.sol)

    def stream(self, plan: PhysicalPlan, catalog: Catalog, work: QueryWork,
               rows_per_batch: int) -> Iterator[pa.RecordBatch]:
        """The query's rows batch by batch, as they are produced."""
        return execute_stream(plan, catalog, self.runtime, work, self.sol, rows_per_batch)

    def report(self, work: QueryWork, wall_s: float) -> dict[str, Any]:
        """What the query cost, with its speed of light."""
        return work.report(wall_s, self.sol)
