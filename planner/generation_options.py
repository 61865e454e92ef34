"""AI functions' constant options: generation options, BigQuery's output_schema and model_params, JSON schemas.

- `constant`: an options expression's value (texts, numbers, booleans, NULL, lists and objects of them);
  anything else is refused (InvalidArgument), with its position in the statement.
- `generation_options`: an options object (max_tokens, temperature, top_p, stop, response_format) as a
  Generation; `generation_of` the same for an AI aggregate (no response_format).
- `output_schema` and `bigquery_params`: BigQuery's spellings turned into the same.
- `literal_of`: a value back as an SQL literal (the reverse of `constant`, for rewritten calls).
"""

from __future__ import annotations

import json
from typing import Any

from sqlglot import exp

from quail.engine.ai.options import Generation
from quail.engine.errors import InvalidArgument
from quail.engine.runtime.grammar import canonical

from quail.planner.dialects import position

# BigQuery's output_schema types: each as the JSON schema type the answer takes, and the SQL type it is read as.
OUTPUT_TYPES = {"STRING": "VARCHAR", "INT64": "BIGINT", "INTEGER": "BIGINT", "FLOAT64": "DOUBLE", "FLOAT": "DOUBLE",
                "BOOL": "BOOLEAN", "BOOLEAN": "BOOLEAN"}
JSON_TYPES = {"VARCHAR": "string", "BIGINT": "integer", "DOUBLE": "number", "BOOLEAN": "boolean"}


def output_schema(node: exp.Expression, call: exp.Expression) -> tuple[tuple[str, str], ...]:
    """BigQuery's output_schema ('name STRING, count INT64, ...') as (field, SQL type) pairs; InvalidArgument
    for a malformed one or a type other than STRING, INT64, FLOAT64 and BOOL.

    >>> output_schema(exp.Literal.string("name STRING, n int64, ok BOOL"), exp.Literal.string(""))
    (('name', 'VARCHAR'), ('n', 'BIGINT'), ('ok', 'BOOLEAN'))
    """
    text = node.this if isinstance(node, exp.Literal) and node.is_string else None
    fields: list[tuple[str, str]] = []
    for part in (text or "").split(","):
        words = part.split()
        if len(words) != 2 or not words[0].isidentifier():
            raise InvalidArgument(f"AI.GENERATE's output_schema must be a text of 'name TYPE' fields separated by "
                                  f"commas{position(call)}")
        if words[1].upper() not in OUTPUT_TYPES:
            raise InvalidArgument(f"AI.GENERATE's output_schema field {words[0]!r} has type {words[1]!r}: use "
                                  f"STRING, INT64, FLOAT64 or BOOL{position(call)}")
        if any(words[0].lower() == field.lower() for field, _ in fields):
            raise InvalidArgument(f"AI.GENERATE's output_schema names {words[0]!r} twice{position(call)}")
        fields.append((words[0], OUTPUT_TYPES[words[1].upper()]))
    return tuple(fields)


_OPTIONS = {"max_tokens": int, "temperature": float, "top_p": float, "stop": tuple, "response_format": dict}


def generation_of(node: exp.Expression, name: str, call: exp.Expression) -> Generation:
    """An AI aggregate's options object (max_tokens, temperature, top_p, stop) as a Generation;
    InvalidArgument for anything else."""
    options = constant(node, name, call)
    if isinstance(options, dict) and "response_format" in {key.lower() for key in options}:
        raise InvalidArgument(f"{name} answers in text: it takes no response_format{position(call)}")
    return generation_options(options, None, name, call)


def generation_options(options: Any, model: str | None, name: str, call: exp.Expression) -> Generation:
    """The options object as a Generation (InvalidArgument for an unknown option or a value of a wrong type)."""
    if not isinstance(options, dict):
        raise InvalidArgument(f"{name}'s options must be an object such as {{'max_tokens': 100}}{position(call)}")
    options = {key.lower(): value for key, value in options.items()}
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise InvalidArgument(f"{name} has no option {unknown[0]!r}: use {', '.join(_OPTIONS)}{position(call)}")
    values: dict[str, Any] = {}
    for key, value in options.items():
        if key == "stop":
            value = (value,) if isinstance(value, str) else value
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise InvalidArgument(f"{name}'s stop must be a text or a list of texts{position(call)}")
            values[key] = tuple(value)
        elif key == "response_format":
            values["schema"] = _schema(value, name, call)
        elif isinstance(value, bool) or not isinstance(value, int | float) or (
                _OPTIONS[key] is int and value != int(value)):
            raise InvalidArgument(f"{name}'s {key} must be a{'n integer' if _OPTIONS[key] is int else ' number'}"
                                  f"{position(call)}")
        else:
            values[key] = _OPTIONS[key](value)
    try:
        return Generation(**values, model=model)
    except InvalidArgument as error:
        raise InvalidArgument(f"{name}: {error}{position(call)}") from None


_BIGQUERY_CONFIG = {"maxOutputTokens": "max_tokens", "temperature": "temperature", "topP": "top_p",
                    "stopSequences": "stop"}


def bigquery_params(params: exp.Expression, call: exp.Expression) -> exp.Expression:
    """BigQuery's model_params JSON ({"generationConfig": {...}}) as the options object of AI_COMPLETE."""
    text = params.this if isinstance(params, exp.Literal) and params.is_string else (
        params.this.this if isinstance(params, exp.ParseJSON) and isinstance(params.this, exp.Literal) else None)
    try:
        parsed = json.loads(text) if text is not None else None
    except json.JSONDecodeError:
        parsed = None
    config = parsed.get("generationConfig", {}) if isinstance(parsed, dict) and set(parsed) <= {"generationConfig"} \
        else None
    if not isinstance(config, dict) or not set(config) <= set(_BIGQUERY_CONFIG):
        raise InvalidArgument(f"AI.GENERATE's model_params must be JSON {{\"generationConfig\": {{...}}}} with "
                              f"{', '.join(_BIGQUERY_CONFIG)}{position(call)}")
    return exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier(_BIGQUERY_CONFIG[k]),
                                                  expression=literal_of(v)) for k, v in config.items()])


def literal_of(value: Any) -> exp.Expression:
    """A JSON value as an SQL literal (texts, numbers, booleans, lists).

    >>> literal_of(["a", 1, True]).sql()
    "ARRAY('a', 1, TRUE)"
    """
    if isinstance(value, (list, tuple)):
        return exp.Array(expressions=[literal_of(v) for v in value])
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    return exp.Literal.string(value) if isinstance(value, str) else exp.Literal.number(value)


def constant(node: exp.Expression, name: str, call: exp.Expression) -> Any:
    """A constant expression's value: texts, numbers, booleans, NULL, lists and objects of them."""
    if isinstance(node, exp.Literal):
        return node.this if node.is_string else json.loads(node.this)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        return -json.loads(node.this.this)
    if isinstance(node, exp.Boolean):
        return node.this
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Array):
        return [constant(v, name, call) for v in node.expressions]
    if isinstance(node, exp.Struct) and all(isinstance(p, exp.PropertyEQ) for p in node.expressions):
        return {p.this.name: constant(p.expression, name, call) for p in node.expressions}
    raise InvalidArgument(f"{name}'s options must be constants{position(node) or position(call)}")


MAX_SCHEMA_DEPTH = 64  # objects and arrays within each other in a response_format


def _depth(value: Any) -> int:
    """How deep objects and arrays nest in a value (JSON text: its brackets, outside strings), without
    recursion."""
    if isinstance(value, str):
        deepest = depth = 0
        quoted = escaped = False
        for char in value:
            if quoted:
                quoted, escaped = (char != '"' or escaped), (char == "\\" and not escaped)
            elif char == '"':
                quoted = True
            elif char in "{[":
                depth += 1
                deepest = max(deepest, depth)
            elif char in "}]":
                depth -= 1
        return deepest
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _schema(value: Any, name: str, call: exp.Expression) -> str | None:
    """A response_format as a JSON schema's canonical text: Snowflake's {'type': 'json', 'schema': {...}}, a
    schema itself, or either as JSON text; NULL: none."""
    if isinstance(value, str):
        if _depth(value) > MAX_SCHEMA_DEPTH:
            raise InvalidArgument(f"{name}'s response_format nests more than {MAX_SCHEMA_DEPTH} deep{position(call)}")
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise InvalidArgument(f"{name}'s response_format is not JSON{position(call)}") from None
    elif _depth(value) > MAX_SCHEMA_DEPTH:
        raise InvalidArgument(f"{name}'s response_format nests more than {MAX_SCHEMA_DEPTH} deep{position(call)}")
    if isinstance(value, dict) and value.get("type") == "json" and "schema" in value:
        value = value["schema"]
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidArgument(f"{name}'s response_format must be a JSON schema (an object){position(call)}")
    return canonical(value)
