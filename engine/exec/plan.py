"""Physical plan nodes: the steps the planner hands to the executor.

Each step describes itself (EXPLAIN's lines), counts the times it asks the
model, and hands itself to a StepVisitor's method for its kind: the executor
runs steps that way, Substrait export translates them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, ClassVar, Generic, Mapping, Protocol, TypeVar, Union

import pyarrow as pa

from quail.engine.ai.cascade import Targets
from quail.engine.ai.kinds import DEFAULT_SELECTIVITY
from quail.engine.ai.options import Aggregation, Generation
from quail.engine.exec.picks import Picks
from quail.engine.runtime.estimates import PROBE_ROWS

T = TypeVar("T", covariant=True)


class StepVisitor(Protocol, Generic[T]):
    """What does something with each kind of step (run it, translate it)."""

    def sql_step(self, step: "SQLStep") -> T: ...

    def ai_step(self, step: "AIStep") -> T: ...

    def ai_chain(self, step: "AIFilterChain") -> T: ...

    def join_choice(self, step: "JoinChoice") -> T: ...

    def ai_aggregate(self, step: "AIAggregate") -> T: ...


class _OneStep:
    """A step that is itself as planned (a join choice is the steps of its first order), asking the model
    `ASKS` times."""

    ASKS: ClassVar[int] = 0
    ROW_BY_ROW: ClassVar[bool] = False

    def asks(self) -> int:
        return self.ASKS

    def row_by_row(self) -> bool:
        """Whether each output row comes from one input row alone, whatever the other rows (AI steps: the
        prompt is a function of the row), so the step may run over its input in chunks."""
        return self.ROW_BY_ROW

    def planned(self) -> tuple["Step", ...]:
        return (self,)


@dataclass(frozen=True)
class SQLStep(_OneStep):
    """Run one DuckDB statement over named relations.

    (tables and earlier outputs); `picks`: the statement
    only picks rows and columns of one relation (the executor takes them in Arrow where DuckDB would
    answer as Arrow does: picks.py). `text`: the statement, or what writes it when it is first needed
    (`sql`; it may be called more than once, from several threads): the text of a statement that picks
    is often never needed. `params`: the values of its `?` placeholders, in order (a statement DuckDB
    runs as written binds them itself)."""

    text: str | Callable[[], str]
    output: str
    picks: Picks | None = None
    params: tuple = ()

    @cached_property
    def sql(self) -> str:
        return self.text if isinstance(self.text, str) else self.text()

    def picked(self, relations: Mapping[str, pa.Table]) -> pa.Table | None:
        """The output taken in Arrow (Picks.take), where the statement only picks rows and columns; else None."""
        return self.picks.take(relations) if self.picks is not None else None

    def describe(self) -> list[str]:
        return [f"DuckDB -> {self.output}: {self.sql}"]

    def visit(self, visitor: StepVisitor[T]) -> T:
        return visitor.sql_step(self)


@dataclass(frozen=True)
class AIStep(_OneStep):
    """Ask the model a question about each row of `input`.

    kind "filter" keeps the rows answered yes; "bool" (yes/no), "score" (P(yes)),
    "classify" (the chosen category) and "complete" (text generated as
    `generation` says) add the answer as `column`. The
    `arg_columns` hold the PROMPT arguments as text, in placeholder order, and
    are dropped from the output. `layout` is "filter" (documents, then the
    question) or "join" (the anchor, the question, then the other documents);
    `anchor` is the placeholder whose document comes first ({0} unless the
    query says otherwise); `labels` are the categories of a classify question,
    answered by letter or by name (`answers`: "letters" or "names", ai/labels.py);
    `selectivity` is the expected fraction answered yes (a hint, or the default);
    `documents` the planner's estimate of the tokens of the anchor documents
    it reads and how many of them it expects resident in the KV pool (None:
    planned without seeing the pool; not part of the step's identity);
    `rows` its estimate of the rows asked (None: not estimated; not part of
    the identity either): a generating step expects at most `max_tokens` a row.
    `targets`: a filter's recall / precision targets or a classification's accuracy target, run as a cascade
    over all its rows at once
    (exec/ai_cascade.py: a sample asked, a proxy on embeddings, the model asked only where it cannot decide).
    """

    ASKS: ClassVar[int] = 1
    ROW_BY_ROW: ClassVar[bool] = True

    input: str
    output: str
    kind: str
    template: str
    arg_columns: tuple[str, ...]
    layout: str = "filter"
    labels: tuple[str, ...] = ()
    column: str = ""
    selectivity: float = DEFAULT_SELECTIVITY
    anchor: int = 0
    answers: str = "letters"
    documents: tuple[float, float] | None = field(default=None, compare=False)
    generation: Generation | None = None
    rows: float | None = field(default=None, compare=False)
    targets: Targets | None = None

    def row_by_row(self) -> bool:
        """Unless a cascade: its sample is drawn from all of its rows."""
        return self.targets is None

    def describe(self) -> list[str]:
        anchor = f", anchor {{{self.anchor}}}" if self.anchor else ""
        how = self.generation.describe() if self.generation is not None else f"selectivity {self.selectivity:g}"
        how += f", a cascade to {self.targets.describe()}" if self.targets is not None else ""
        expected = "" if self.documents is None else (f"; expects ~{self.documents[1]:,.0f} of "
                                                       f"{self.documents[0]:,.0f} document tokens resident")
        if self.generation is not None and self.rows is not None:
            expected += f"; expects at most ~{self.rows * self.generation.max_tokens:,.0f} generated tokens"
        return [f"AI {self.kind} ({self.layout} layout{anchor}, {how}) "
                f"{self.input} -> {self.output}: {self.template!r} over {list(self.arg_columns)}{expected}"]

    def visit(self, visitor: StepVisitor[T]) -> T:
        return visitor.ai_step(self)


@dataclass(frozen=True)
class AIFilterChain(_OneStep):
    """AI filters over `input`, all of which a row must pass; the output keeps the input's order.

    With a `limit` (a LIMIT reaching the model) rows are taken in input order,
    in growing chunks, until `limit` rows pass: the same rows whatever the chunk
    sizes. Without one, every row is asked: the first PROBE_ROWS in plan order,
    the rest with the filters re-ranked by the selectivities observed on those.
    """

    input: str
    output: str
    filters: tuple[AIStep, ...]
    limit: int | None = None

    @classmethod
    def over(cls, filters: list[AIStep], limit: int | None) -> "AIFilterChain":
        """The chain of filters that follow one another, each reading the one before's output."""
        return cls(filters[0].input, filters[-1].output, tuple(filters), limit)

    def describe(self) -> list[str]:
        """One line, then one per filter, indented."""
        head = (f"AI filters until {self.limit} rows pass, in table order" if self.limit is not None else
                f"AI filters, in this order for the first {PROBE_ROWS} rows, then ranked by observed selectivity")
        return [f"{head}: {self.input} -> {self.output}"] + ["  " + f.describe()[0] for f in self.filters]

    def asks(self) -> int:
        return len(self.filters)

    def row_by_row(self) -> bool:
        """Without a limit (with one, which rows are asked depends on the rows before them)."""
        return self.limit is None

    def visit(self, visitor: StepVisitor[T]) -> T:
        return visitor.ai_chain(self)


@dataclass(frozen=True)
class AIAggregate(_OneStep):
    """Reduce each group's list of texts to the model's answer.

    Reduce each row's list of texts in each of `columns` (column, aggregation) to the model's answer, a
    string in the list's place (engine/ai/aggregate.py); a row is a group of the SELECT it comes from."""

    ROW_BY_ROW: ClassVar[bool] = True

    input: str
    output: str
    columns: tuple[tuple[str, Aggregation], ...]

    def describe(self) -> list[str]:
        return [f"AI aggregate {self.input} -> {self.output}: {column!r}: {aggregation.describe()}"
                for column, aggregation in self.columns]

    def asks(self) -> int:
        return len(self.columns)

    def visit(self, visitor: StepVisitor[T]) -> T:
        return visitor.ai_aggregate(self)


def filter_rank(template: str, selectivity: float) -> float:
    """Cost per row over the fraction of rows a filter removes (Hellerstein and Stonebraker): lower first.

    Filters on one table read the same documents, so the question's length is
    what their costs differ by.
    """
    return (len(template) + 1) / (1 - min(selectivity, 0.999))


@dataclass(frozen=True)
class JoinChoice:
    """An AI core's join orders, one chosen when its cores' rows are known.

    `cores` are the relations joined (in slot order); each alternative's steps
    (for `orders[k]`, table aliases) end in `output`. `pick` takes the cores'
    observed row counts and returns the index of the cheapest order under the
    planner's cost model: the estimates it planned with, with observed rows.
    """

    cores: tuple[str, ...]
    orders: tuple[tuple[str, ...], ...]
    alternatives: tuple[tuple["Step", ...], ...]
    output: str
    pick: Callable[[list[int]], int] = field(compare=False, repr=False)

    def describe(self) -> list[str]:
        orders = "; ".join(", ".join(order) for order in self.orders)
        return ([f"join order chosen by the cores' observed rows, among: {orders} -> {self.output}; "
                 f"the first, as planned:"] + ["  " + line for sub in self.alternatives[0] for line in sub.describe()])

    def row_by_row(self) -> bool:
        return False

    def asks(self) -> int:
        """Its first order's."""
        return ai_steps(self.alternatives[0])

    def planned(self) -> tuple["Step", ...]:
        """The steps of the order planned first."""
        return tuple(s for step in self.alternatives[0] for s in step.planned())

    def visit(self, visitor: StepVisitor[T]) -> T:
        return visitor.join_choice(self)


Step = Union[SQLStep, AIStep, AIFilterChain, JoinChoice, AIAggregate]


def ai_steps(steps: tuple[Step, ...]) -> int:
    """How many times the steps ask the model (a filter chain: once per filter; a join choice: its first order)."""
    return sum(step.asks() for step in steps)


@dataclass(frozen=True)
class PhysicalPlan:
    """Steps in execution order; `tables` are the stored tables they read, `result` the final relation.

    `parameters` is how many `?` placeholders the query text had (bound before planning);
    `notes` are the planner's words on its choices (EXPLAIN shows them);
    `analyze`: run the steps, then return what each did instead of their rows
    (EXPLAIN ANALYZE: one string column, `plan`); `chunked`: the input of the
    first non-SQL step may run through the remaining steps in consecutive chunks
    of rows, each chunk's result rows complete (planner/streaming.py).
    """

    steps: tuple[Step, ...]
    tables: tuple[str, ...]
    result: str
    parameters: int = 0
    notes: tuple[str, ...] = ()
    analyze: bool = False
    chunked: bool = False


ROWS = "__quail_rows"  # the relation a write reads its AI work's rows from
_TRANSACTIONS = {"BEGIN": "begin", "START": "begin", "COMMIT": "commit", "END": "commit", "ROLLBACK": "rollback",
                 "ABORT": "rollback"}


@dataclass(frozen=True)
class Write:
    """A statement DuckDB runs when its call comes: DDL, DML, transaction control, settings.

    A statement DuckDB runs when its call comes, not when its rows are fetched: DDL, DML, transaction
    control, settings. Its result is its RETURNING rows (`returns_rows`), else one row: the rows it changed.

    - `sql`: the statement as DuckDB runs it; `kind`: DuckDB's statement type (INSERT, CREATE, ...);
      `params`: the values of its `?` placeholders (`parameters` of them), None until bound.
    - `prelude`: the AI work it reads, run first, and `reads`: the relations of it registered for the statement
      (ROWS: the rows an INSERT ... SELECT or CREATE TABLE ... AS writes; or each AI call's answers,
      planner/answers_first.py); None: it asks the model nothing.
    - `tables`: the catalog's Arrow relations it reads (registered as it runs); `target`: the table it
      creates or writes, as DuckDB names it, where the planner could tell (None: none, or not known).
    """

    sql: str
    kind: str
    returns_rows: bool
    parameters: int = 0
    params: tuple | None = None
    prelude: PhysicalPlan | None = None
    reads: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    target: str | None = None

    @property
    def transaction(self) -> str | None:
        """"begin", "commit" or "rollback" for a statement that starts or ends a transaction, else None."""
        if self.kind != "TRANSACTION":
            return None
        return _TRANSACTIONS.get(self.sql.split(None, 1)[0].upper())
