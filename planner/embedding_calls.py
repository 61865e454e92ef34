"""AI_SIMILARITY's and AI_EMBED's arguments, and an argument spelled as the FLOAT[] list DuckDB compares.

- `arguments`: a call's arguments in order, BigQuery's named contents after the positional ones (the
  options of the model a BigQuery call would reach are ignored: the model is the server's).
- `vector`: an argument embedded when it is a text, cast when it already is an embedding (DuckDB tells
  which by its type when it binds the statement, and keeps only that branch).
- `embedded`: a text's embedding, `ai_embed_for` given the key of the statement's work first (`work_key`:
  a cancel or time limit stops the embedding model's passes; engine/exec/embedding_functions.py).
- `filled`: a DuckDB SQL template with expressions put in its places (the rewrites' building block).
"""

from __future__ import annotations

from sqlglot import exp, parse_one

from quail.engine.errors import InvalidArgument
from quail.engine.exec.function_names import EMBED, STOPPING
from quail.engine.runtime.query_work import WORK_VARIABLE

from quail.planner.ai_calls import named_arguments
from quail.planner.dialects import position

DEFAULT_MODEL = "default"
SIMILARITY = ("AI_SIMILARITY", "AI.SIMILARITY")
_VECTOR = "CASE WHEN typeof(X) = 'VARCHAR' THEN CAST(E AS FLOAT[]) ELSE CAST(X AS FLOAT[]) END"
_PARAMETERS = {"AI.SIMILARITY": ("content1", "content2"), "AI.EMBED": ("content",)}
_IGNORED = {"endpoint", "connection_id", "model_params", "task_type", "title"}


def arguments(name: str, call: exp.Expression) -> list[exp.Expression]:
    """A call's arguments in order: positional ones, then BigQuery's named contents in their order;
    InvalidArgument for a name the call does not take."""
    positional, named = named_arguments(call)
    unknown = set(named) - _IGNORED - set(_PARAMETERS.get(name, ()))
    if unknown:
        raise InvalidArgument(f"{name} takes no argument named {sorted(unknown)[0]}{position(call)}")
    return positional + [named[key] for key in _PARAMETERS.get(name, ()) if key in named]


def vector(argument: exp.Expression) -> exp.Expression:
    """An argument of AI_SIMILARITY as a FLOAT[] list: embedded when it is a text, else cast."""
    text = exp.Cast(this=argument.copy(), to=exp.DataType.build("VARCHAR"))
    return filled(_VECTOR, {"X": argument, "E": embedded(exp.Literal.string(DEFAULT_MODEL), text)})


def embedded(model: exp.Expression, text: exp.Expression) -> exp.Expression:
    """The embedding of a text by the named model, as DuckDB runs it (stopped with the statement)."""
    return exp.Anonymous(this=EMBED + STOPPING, expressions=[work_key(), model, text])


def work_key() -> exp.Expression:
    """The key of the statement's work, as the connection running it holds it (engine/exec/relational.py)."""
    return exp.Anonymous(this="getvariable", expressions=[exp.Literal.string(WORK_VARIABLE)])


def filled(template: str, places: dict[str, exp.Expression]) -> exp.Expression:
    """A DuckDB SQL template parsed, each unqualified column or table named by a key of `places` replaced by
    a copy of its expression."""
    tree = parse_one(template, read="duckdb")
    for node in list(tree.find_all(exp.Column, exp.Table)):
        if node.name in places and not (isinstance(node, exp.Column) and node.table):
            node.replace(places[node.name].copy())
    return tree
