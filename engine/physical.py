"""Physical plan nodes: the steps the planner hands to the executor."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Union

AI_KINDS = ("filter", "bool", "score", "classify")


@dataclass(frozen=True)
class SQLStep:
    """Run one DuckDB statement over named relations (tables and earlier outputs)."""

    sql: str
    output: str


@dataclass(frozen=True)
class AIStep:
    """Ask the model a question about each row of `input`.

    kind "filter" keeps the rows answered yes; "bool" (yes/no), "score" (P(yes))
    and "classify" (the chosen category) add the answer as `column`. The
    `arg_columns` hold the PROMPT arguments as text, in placeholder order, and
    are dropped from the output. `layout` is "filter" (documents, then the
    question) or "join" (the anchor, the question, then the other documents);
    `anchor` is the placeholder whose document comes first ({0} unless the
    query says otherwise); `labels` are the categories of a classify question,
    answered by letter or by name (`answers`: "letters" or "names", label_trie.py);
    `selectivity` is the expected fraction answered yes (a hint, or the default).
    """

    input: str
    output: str
    kind: str
    template: str
    arg_columns: tuple[str, ...]
    layout: str = "filter"
    labels: tuple[str, ...] = ()
    column: str = ""
    selectivity: float = 0.2
    anchor: int = 0
    answers: str = "letters"


@dataclass(frozen=True)
class AIFilterChain:
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


PROBE_ROWS = 64
CHARS_PER_TOKEN = 4.0  # for estimates only: English text in a BPE vocabulary
CHUNK_ROWS = (64, 8192)  # a chunked plan's first and largest chunks: the first rows leave after a pass or two


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


Step = Union[SQLStep, AIStep, AIFilterChain, JoinChoice]


def _describe_ai(step: AIStep) -> str:
    anchor = f", anchor {{{step.anchor}}}" if step.anchor else ""
    return (f"AI {step.kind} ({step.layout} layout{anchor}, selectivity {step.selectivity:g}) "
            f"{step.input} -> {step.output}: {step.template!r} over {list(step.arg_columns)}")


def describe(step: Step) -> list[str]:
    """A step as EXPLAIN lists it: one line (a filter chain: one, then one per filter, indented)."""
    if isinstance(step, AIStep):
        return [_describe_ai(step)]
    if isinstance(step, AIFilterChain):
        head = (f"AI filters until {step.limit} rows pass, in table order" if step.limit is not None else
                f"AI filters, in this order for the first {PROBE_ROWS} rows, then ranked by observed selectivity")
        return [f"{head}: {step.input} -> {step.output}"] + ["  " + _describe_ai(f) for f in step.filters]
    if isinstance(step, JoinChoice):
        orders = "; ".join(", ".join(order) for order in step.orders)
        return ([f"join order chosen by the cores' observed rows, among: {orders} -> {step.output}; "
                 f"the first, as planned:"] + ["  " + line for sub in step.alternatives[0] for line in describe(sub)])
    return [f"DuckDB -> {step.output}: {step.sql}"]


def ai_steps(steps: tuple[Step, ...]) -> int:
    """How many times the steps ask the model (a filter chain: once per filter; a join choice: its first order)."""
    count = 0
    for step in steps:
        if isinstance(step, AIStep):
            count += 1
        elif isinstance(step, AIFilterChain):
            count += len(step.filters)
        elif isinstance(step, JoinChoice):
            count += ai_steps(step.alternatives[0])
    return count


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
