"""Physical plan nodes: the steps the planner hands to the executor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

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
    query says otherwise); `labels` are the categories of a classify question;
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


@dataclass(frozen=True)
class AIFilterChain:
    """AI filters over `input` that stop once `limit` rows pass them all (a LIMIT reaching the model).

    Rows are taken in input order, in growing chunks; the output is the first
    `limit` rows of the input, in order, that every filter keeps: the same rows
    whatever the chunk sizes.
    """

    input: str
    output: str
    filters: tuple[AIStep, ...]
    limit: int


Step = Union[SQLStep, AIStep, AIFilterChain]


def _describe_ai(step: AIStep) -> str:
    anchor = f", anchor {{{step.anchor}}}" if step.anchor else ""
    return (f"AI {step.kind} ({step.layout} layout{anchor}, selectivity {step.selectivity:g}) "
            f"{step.input} -> {step.output}: {step.template!r} over {list(step.arg_columns)}")


def describe(step: Step) -> list[str]:
    """A step as EXPLAIN lists it: one line (a filter chain: one, then one per filter, indented)."""
    if isinstance(step, AIStep):
        return [_describe_ai(step)]
    if isinstance(step, AIFilterChain):
        return ([f"AI filters until {step.limit} rows pass, in table order: {step.input} -> {step.output}"]
                + ["  " + _describe_ai(f) for f in step.filters])
    return [f"DuckDB -> {step.output}: {step.sql}"]


@dataclass(frozen=True)
class PhysicalPlan:
    """Steps in execution order; `tables` are the stored tables they read, `result` the final relation.

    `parameters` is how many `?` placeholders the query text had (bound before planning);
    `notes` are the planner's words on its choices (EXPLAIN shows them);
    `analyze`: run the steps, then return what each did instead of their rows
    (EXPLAIN ANALYZE: one string column, `plan`).
    """

    steps: tuple[Step, ...]
    tables: tuple[str, ...]
    result: str
    parameters: int = 0
    notes: tuple[str, ...] = ()
    analyze: bool = False
