"""AI aggregates (AI_AGG, AI_SUMMARIZE_AGG): a SELECT's groups collect their texts in DuckDB, the model reduces them.

A SELECT with AI aggregates is planned as the same SELECT with each AI
aggregate replaced by the list of its texts (`LIST(expr ORDER BY expr)`: an
order fixed by the texts, so the reduction is too), then an AI aggregate step
that turns each list into the model's answer (engine/ai/aggregate.py). So the
grouping, the other aggregates, WHERE (AI filters included), HAVING and LIMIT
all run before any text is generated, and only for the groups returned.
"""

from __future__ import annotations

from sqlglot import exp, parse_one

from quail.engine.ai.options import SUMMARIZE, Aggregation, Generation
from quail.engine.errors import InvalidArgument
from quail.planner.ai_calls import AGGREGATES, ai_name, ancestors
from quail.planner.generation_options import generation_of
from quail.planner.dialects import position


def ai_aggregates(select: exp.Select) -> list[exp.Expression]:
    """The SELECT's own AI aggregate calls (not those of its subqueries)."""
    return [node for node in select.walk() if ai_name(node) in AGGREGATES
            and next((a for a in ancestors(node) if isinstance(a, exp.Select)), None) is select]


def collect_texts(select: exp.Select) -> list[tuple[str, Aggregation]]:
    """Replace each AI aggregate of the SELECT (in place) by the list of its texts; each such column's name and
    aggregation. An AI aggregate must be a column of the SELECT by itself, not read by its ORDER BY, HAVING or
    QUALIFY (they would see the texts, not the answer)."""
    columns = []
    for call in ai_aggregates(select):
        item = call.parent
        if not isinstance(item, exp.Alias) or item.parent is not select:
            raise InvalidArgument(f"{ai_name(call)} must be a column of the SELECT by itself: compute it in a "
                                  f"subquery to use its answer in an expression{position(call)}")
        for clause in ("order", "having", "qualify"):
            node = select.args.get(clause)
            if node is not None and any(c.name.lower() == item.alias.lower() for c in node.find_all(exp.Column)):
                raise InvalidArgument(f"{clause.upper()} cannot read {ai_name(call)}'s column {item.alias!r}: "
                                      f"select it in a subquery and order or filter outside{position(call)}")
        text, aggregation = _bind(call)
        texts = text.sql("duckdb")
        item.set("this", parse_one(f"LIST({texts} ORDER BY {texts})", read="duckdb"))
        columns.append((item.alias, aggregation))
    return columns


def _bind(call: exp.Expression) -> tuple[exp.Expression, Aggregation]:
    """AI_AGG(expr, 'instruction' [, options]) or AI_SUMMARIZE_AGG(expr [, options]): the texts' expression and
    the aggregation (answers as the options say: max_tokens, temperature, top_p, stop; by default of at most
    DEFAULT_MAX_TOKENS, greedy; as many texts a prompt as fit the context). With options the call comes as a
    plain function call (dialects.AI_AGGREGATES)."""
    name = ai_name(call)
    args = call.expressions if isinstance(call, exp.Anonymous) else [a for a in (call.this, call.expression) if a]
    takes = 1 if name == "AI_SUMMARIZE_AGG" else 2
    if not args or args[0].find(exp.Column) is None:
        raise InvalidArgument(f"{name} asks nothing of the rows: give it a column to aggregate{position(call)}")
    generation = generation_of(args[takes], name, call) if len(args) > takes else Generation()
    if name == "AI_SUMMARIZE_AGG":
        return args[0], Aggregation(SUMMARIZE, generation)
    instruction = args[1]
    if not (isinstance(instruction, exp.Literal) and instruction.is_string and instruction.this.strip()):
        raise InvalidArgument(f"{name}'s instruction must be a string literal{position(call)}")
    return args[0], Aggregation(instruction.this, generation)
