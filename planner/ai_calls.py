"""Binding AI function calls in a syntax tree: what is asked, of which expressions, answered how.

Snowflake spellings: AI_FILTER(PROMPT('... {0} ...', a, ...) [, {'selectivity': s, 'anchor': k}]),
AI_CLASSIFY(input, ['label', ...]) → OBJECT {"labels": [...]}, AI_SCORE(PROMPT(...)),
AI_COMPLETE(prompt [, options]) or AI_COMPLETE(model, prompt [, model_parameters [, response_format]])
→ STRING (JSON with a response_format), AI_EXTRACT(text, questions_or_schema [, options]) → JSON.
BigQuery spellings: AI.IF(('text ', col, ' text')), AI.CLASSIFY(input, ['label', ...]) → STRING,
AI.SCORE(prompt), AI.GENERATE(prompt [, model_params => ...]) → STRUCT(result, status), or with
output_schema => 'name TYPE, ...' STRUCT(its fields, full_response, status). A prompt is
PROMPT('template', args...), a tuple of parts (string literals are text, other parts documents) or a
string literal; a generating call's prompt may also be any expression: its value is the instruction.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from quail.engine.ai.cascade import Targets
from quail.engine.ai.kinds import DEFAULT_SELECTIVITY, SQL_NAMES
from quail.engine.ai.options import Generation
from quail.engine.errors import InvalidArgument
from quail.engine.exec.function_names import REGISTERED
from quail.engine.runtime.prompt import placeholders

from quail.planner.binder import is_unbound
from quail.planner.dialects import position
from quail.planner.generation_options import JSON_TYPES, bigquery_params, constant, generation_options, output_schema

AGGREGATES = {"AI_AGG", "AI_SUMMARIZE_AGG"}  # planned around their SELECT (planner/aggregates.py), never bound here
KNOWN = set(SQL_NAMES) | AGGREGATES
EMBEDDING = {"AI_EMBED", "AI_SIMILARITY", "AI.EMBED", "AI.SIMILARITY"}  # spelled for DuckDB (embeddings.py)
DUCKDB_RUNS = EMBEDDING | {name.upper() for name in REGISTERED}  # the AI_* functions DuckDB runs
FILTER_OPTIONS = {"selectivity", "anchor", "recall", "precision", "confidence"}
CLASSIFY_OPTIONS = {"answers", "accuracy", "confidence"}
_IGNORED_KWARGS = {"connection_id", "endpoint", "model_params", "model"}
_GENERATING_IGNORED = {"connection_id", "endpoint", "request_type"}  # where the model runs: here, always
CLASSIFY_TEMPLATE = "Which category does {0} belong to?"


@dataclass(frozen=True)
class AICall:
    """One AI function call, bound: kind ("filter", "score", "classify"), template and documents."""

    name: str
    kind: str
    template: str
    args: tuple[exp.Expression, ...]
    labels: tuple[str, ...] = ()
    selectivity: float | None = None
    anchor: int = 0
    answers: str = "letters"
    generation: Generation | None = None
    fields: tuple[tuple[str, str], ...] = ()  # AI.GENERATE's output_schema: each field's name and SQL type
    targets: Targets | None = None  # a cascade's targets: AI_FILTER's recall / precision, AI_CLASSIFY's accuracy

    @property
    def expected_selectivity(self) -> float:
        """The fraction answered yes the plan expects: the query's hint, else DEFAULT_SELECTIVITY."""
        return self.selectivity or DEFAULT_SELECTIVITY


def _function_name(func: exp.Func) -> str:
    return (func.name if isinstance(func, exp.Anonymous) else func.sql_name()).upper()


def ai_name(node: exp.Expression) -> str | None:
    """'AI_FILTER', 'AI.IF', ... when node calls an AI function of the language model (known or not), else None
    (the embedding functions are DuckDB's: embeddings.py)."""
    name = embedding_name(node)
    return None if name in DUCKDB_RUNS else name


def embedding_name(node: exp.Expression) -> str | None:
    """'AI_FILTER', 'AI.IF', 'AI_EMBED', ... when node calls a function named AI_* or AI.*, else None."""
    if isinstance(node, exp.Dot) and isinstance(node.this, exp.Expression) and node.this.name.upper() == "AI" \
            and isinstance(node.expression, exp.Func):
        return "AI." + _function_name(node.expression).removeprefix("AI_")
    if isinstance(node, exp.Func) and not isinstance(node.parent, exp.Dot):
        name = _function_name(node)
        if name.startswith("AI_"):
            return name
    return None


def ancestors(node: exp.Expression):
    """The node's parents, innermost first."""
    parent = node.parent
    while parent is not None:
        yield parent
        parent = parent.parent


def _raw_arguments(func: exp.Func) -> list[exp.Expression]:
    """A call's arguments in order, for anonymous and typed (sqlglot-known) functions alike."""
    if isinstance(func, exp.Anonymous):
        return list(func.expressions)
    out: list[exp.Expression] = []
    for key in func.arg_types:
        value = func.args.get(key)
        if value is not None:
            out.extend(value if isinstance(value, list) else [value])
    return out


def ai_calls(tree: exp.Expression) -> list[exp.Expression]:
    """Every AI function call in the tree, outermost first; unknown AI names are an error."""
    calls = [n for n in tree.walk() if ai_name(n)]
    for call in calls:
        if ai_name(call) not in KNOWN:
            raise InvalidArgument(f"unknown AI function {ai_name(call)}{position(call)}")
        if isinstance(call.parent, exp.Window) and call.parent.this is call:
            raise InvalidArgument(f"{ai_name(call)} is not a window function: compute it in a subquery and use "
                                  f"its column in the window{position(call)}")
    return calls


def contains_ai(node: exp.Expression) -> bool:
    return any(ai_name(n) for n in node.walk())


def named_arguments(call: exp.Expression, ignored: set[str] = frozenset()
                    ) -> tuple[list[exp.Expression], dict[str, exp.Expression]]:
    """A call's positional arguments in order, and its named ones (`name => value`) by lowercased name,
    those in `ignored` left out."""
    inner = call.expression if isinstance(call, exp.Dot) else call
    positional, named = [], {}
    for arg in _raw_arguments(inner):
        if isinstance(arg, (exp.Kwarg, exp.PropertyEQ)):
            key = arg.this.name.lower()
            if key not in ignored:
                named[key] = arg.expression
        else:
            positional.append(arg)
    return positional, named


def bind(call: exp.Expression) -> AICall:
    """The bound form of an AI call; InvalidArgument names what is wrong and where (a call asks about
    at least one document: a column, or any expression, of each row)."""
    bound = _bind(call)
    if not any(arg.find(exp.Column) for arg in bound.args):
        raise InvalidArgument(f"{bound.name} asks nothing of the rows: give it a document, as in "
                              f"PROMPT('... {{0}} ...', column){position(call)}")
    return bound


def _bind(call: exp.Expression) -> AICall:
    name = ai_name(call)
    if SQL_NAMES[name] == "complete":
        binder = _bind_extract if name == "AI_EXTRACT" else _bind_complete
        return binder(name, call, *named_arguments(call, _GENERATING_IGNORED))
    positional, named = named_arguments(call, _IGNORED_KWARGS)
    if "prompt" in named:
        positional.insert(0, named.pop("prompt"))
    if SQL_NAMES[name] == "classify":
        if "categories" in named:
            positional.insert(1, named.pop("categories"))
        return _bind_classify(name, call, positional, named)
    if named:
        raise InvalidArgument(f"{name} has no argument named {next(iter(named))!r}{position(call)}")
    if not 1 <= len(positional) <= 2:
        raise InvalidArgument(f"{name} takes a prompt and optional options, got {len(positional)} argument(s)"
                              f"{position(call)}")
    template, args = _bind_prompt(name, positional[0], call)
    selectivity, anchor, targets = (_options(name, positional[1], call, len(args)) if len(positional) == 2
                                    else (None, 0, None))
    if targets is not None and SQL_NAMES[name] != "filter":
        raise InvalidArgument(f"recall and precision targets are AI_FILTER's (a cascade), not {name}'s"
                              f"{position(call)}")
    return AICall(name, SQL_NAMES[name], template, args, selectivity=selectivity, anchor=anchor, targets=targets)


def _bind_classify(name: str, call: exp.Expression, positional: list[exp.Expression],
                   named: dict[str, exp.Expression]) -> AICall:
    if named:
        raise InvalidArgument(f"{name} has no argument named {next(iter(named))!r}{position(call)}")
    if len(positional) not in (2, 3):
        raise InvalidArgument(f"{name} takes an input and a list of categories{position(call)}")
    source, categories = positional[0], positional[1]
    if not isinstance(categories, exp.Array) or not all(
            isinstance(c, exp.Literal) and c.is_string for c in categories.expressions):
        raise InvalidArgument(f"{name}'s categories must be a list of string literals{position(call)}")
    labels = tuple(c.this for c in categories.expressions)
    if len(set(labels)) != len(labels) or not 2 <= len(labels) <= 26:
        raise InvalidArgument(f"{name} needs 2 to 26 distinct categories, not {len(labels)}{position(call)}")
    if isinstance(source, exp.Anonymous) and source.name.upper() == "PROMPT":
        template, args = _bind_template(source)
    elif isinstance(source, exp.Tuple):
        template, args = _bind_parts(source.expressions)
    else:
        template, args = CLASSIFY_TEMPLATE, (source,)
    answers, targets = _classify_config(name, positional[2], call) if len(positional) == 3 else ("letters", None)
    return AICall(name, "classify", template, args, labels, answers=answers, targets=targets)


def _classify_config(name: str, config: exp.Expression, call: exp.Expression) -> tuple[str, Targets | None]:
    """{'answers': 'letters' | 'names', 'accuracy': a, 'confidence': c}, any of them: how the model names its
    category (default: by letter), and a cascade's accuracy target (engine/ai/cascade_classify.py)."""
    pairs = config.expressions if isinstance(config, exp.Struct) else None
    values = {p.this.name.lower(): p.expression for p in pairs or [] if isinstance(p, exp.PropertyEQ)}
    answers = values.get("answers", exp.Literal.string("letters"))
    numbers = [values[k] for k in ("accuracy", "confidence") if k in values]
    if not pairs or len(values) != len(pairs) or not set(values) <= CLASSIFY_OPTIONS or not (
            isinstance(answers, exp.Literal) and answers.is_string and answers.this in ("letters", "names")) or any(
            not isinstance(n, exp.Literal) or n.is_string for n in numbers):
        raise InvalidArgument(f"{name}'s config must be {{'answers': 'letters' | 'names'}}, with a cascade's "
                              f"{{'accuracy': <number>, 'confidence': <number>}}{position(call)}")
    return answers.this, _targets(values, call)


def _options(name: str, options: exp.Expression, call: exp.Expression,
             documents: int) -> tuple[float | None, int, Targets | None]:
    """{'selectivity': s, 'anchor': k, 'recall': r, 'precision': p, 'confidence': c}, any of them.

    - selectivity: the expected fraction answered yes (0 < s ≤ 1);
    - anchor: the placeholder whose document comes first in the prompt, shared by the requests that name it;
    - recall, precision (either or both), confidence (default 0.95): a cascade's targets against the model's
      answers on every row (engine/ai/cascade.py).
    """
    pairs = options.expressions if isinstance(options, exp.Struct) else None
    values = {}
    for pair in pairs or []:
        if isinstance(pair, exp.PropertyEQ) and isinstance(pair.expression, exp.Literal):
            values[pair.this.name.lower()] = pair.expression
    if not pairs or len(values) != len(pairs) or not set(values) <= FILTER_OPTIONS or any(
            v.is_string for v in values.values()):
        raise InvalidArgument(f"{name}'s options must be {{'selectivity': <number>, 'anchor': <placeholder>}}, "
                              f"with a cascade's {{'recall': <number>, 'precision': <number>, 'confidence': "
                              f"<number>}}{position(call)}")
    selectivity = float(values["selectivity"].this) if "selectivity" in values else None
    if selectivity is not None and not 0 < selectivity <= 1:
        raise InvalidArgument(f"selectivity must be in (0, 1], not {selectivity}{position(call)}")
    anchor = values["anchor"].this if "anchor" in values else "0"
    if not anchor.isdigit() or int(anchor) >= documents:
        raise InvalidArgument(f"anchor must name a placeholder, 0 to {documents - 1}, not {anchor}{position(call)}")
    return selectivity, int(anchor), _targets(values, call)


def _targets(values: dict[str, exp.Literal], call: exp.Expression) -> Targets | None:
    """A cascade's targets among the options (None: none given; InvalidArgument: out of range)."""
    given = {key: float(values[key].this) for key in ("recall", "precision", "accuracy", "confidence") if key in values}
    if not given:
        return None
    try:
        return Targets(**given)
    except InvalidArgument as err:
        raise InvalidArgument(f"{err}{position(call)}") from None


def _bind_prompt(name: str, prompt: exp.Expression, call: exp.Expression) -> tuple[str, tuple[exp.Expression, ...]]:
    if isinstance(prompt, exp.Anonymous) and prompt.name.upper() == "PROMPT":
        return _bind_template(prompt)
    if isinstance(prompt, exp.Tuple):
        return _bind_parts(prompt.expressions)
    if isinstance(prompt, exp.Literal) and prompt.is_string:
        return _bind_parts([prompt])
    raise InvalidArgument(
        f"{name} expects PROMPT('... {{0}} ...', column, ...) or a string literal{position(call)}"
    )


def _bind_template(prompt: exp.Anonymous) -> tuple[str, tuple[exp.Expression, ...]]:
    if prompt.expressions and is_unbound(prompt.expressions[0]):  # PROMPT(?, ...) prepared: a stand-in
        return " ".join(f"{{{i}}}" for i in range(len(prompt.expressions) - 1)), tuple(prompt.expressions[1:])
    if not prompt.expressions or not (isinstance(prompt.expressions[0], exp.Literal) and prompt.expressions[0].is_string):
        raise InvalidArgument(f"PROMPT's first argument must be a string literal template{position(prompt)}")
    template, args = prompt.expressions[0].this, tuple(prompt.expressions[1:])
    used = set(placeholders(template))
    missing = sorted(i for i in used if i >= len(args))
    if missing:
        raise InvalidArgument(
            f"PROMPT template uses {{{missing[0]}}} but has {len(args)} argument(s){position(prompt)}"
        )
    unused = [i for i in range(len(args)) if i not in used]
    if unused:
        raise InvalidArgument(
            f"PROMPT argument {unused[0] + 1} has no placeholder {{{unused[0]}}} in the template{position(prompt)}"
        )
    return template, args


def _bind_parts(parts: list[exp.Expression]) -> tuple[str, tuple[exp.Expression, ...]]:
    """BigQuery's prompt tuple: string literals are text, every other part is a document."""
    template, args = [], []
    for part in parts:
        if isinstance(part, exp.Literal) and part.is_string:
            template.append(part.this)
        else:
            template.append(f"{{{len(args)}}}")
            args.append(part)
    return "".join(template), tuple(args)


AS_INSTRUCTION = "Do what {0} asks."  # the template of a generating call whose prompt is an expression


def _bind_complete(name: str, call: exp.Expression, positional: list[exp.Expression],
                   named: dict[str, exp.Expression]) -> AICall:
    """AI_COMPLETE(prompt [, options]); Snowflake's AI_COMPLETE(model, prompt [, model_parameters
    [, response_format [, show_details]]]), positional or named; AI.GENERATE(prompt [, model_params => ...]
    [, output_schema => ...]). The options name max_tokens, temperature, top_p and stop; BigQuery's
    model_params its generationConfig; an output_schema is a response_format of an object of those fields."""
    model = named.pop("model", None)
    if "prompt" in named:
        positional.insert(0, named.pop("prompt"))
    elif model is None and len(positional) >= 2 and not isinstance(positional[1], exp.Struct):
        model = positional.pop(0)  # Snowflake's order: the model, then the prompt
    if model is not None:
        positional[1:1] = [named.pop(k) for k in ("model_parameters", "response_format", "show_details")
                           if k in named]
    elif "model_params" in named:
        positional.append(bigquery_params(named.pop("model_params"), call))
    fields = output_schema(named.pop("output_schema"), call) if "output_schema" in named else ()
    if named:
        raise InvalidArgument(f"{name} has no argument named {next(iter(named))!r}{position(call)}")
    if not 1 <= len(positional) <= (4 if model is not None else 2):
        raise InvalidArgument(f"{name} takes a prompt and optional options{' (after the model)' if model else ''}, "
                              f"got {len(positional)} argument(s){position(call)}")
    prompt, *rest = positional
    options = constant(rest[0], name, call) if rest else {}
    if len(rest) > 1 and isinstance(options, dict):
        options = {**options, "response_format": constant(rest[1], name, call)}
    if len(rest) > 2 and constant(rest[2], name, call):
        raise InvalidArgument(f"{name}: show_details is not supported{position(call)}")
    if isinstance(prompt, exp.Anonymous) and prompt.name.upper() == "PROMPT" or isinstance(prompt, exp.Tuple) or (
            isinstance(prompt, exp.Literal) and prompt.is_string):
        template, args = _bind_prompt(name, prompt, call)
    else:
        template, args = AS_INSTRUCTION, (prompt,)
    served = None
    if model is not None:
        served = constant(model, name, call)
        if not isinstance(served, str):
            raise InvalidArgument(f"{name}'s model must be a string literal{position(call)}")
    if fields:
        if not isinstance(options, dict) or "response_format" in options:
            raise InvalidArgument(f"{name} takes an output_schema or a response_format, not both{position(call)}")
        options = {**options, "response_format": {
            "type": "object", "properties": {field: {"type": JSON_TYPES[kind]} for field, kind in fields},
            "required": [field for field, _ in fields], "additionalProperties": False}}
    return AICall(name, "complete", template, args, answers="text",
                  generation=generation_options(options, served, name, call), fields=fields)


EXTRACT_ANSWER_CHARS = 100  # the longest answer AI_EXTRACT takes to a question (a field of its JSON)


def _bind_extract(name: str, call: exp.Expression, positional: list[exp.Expression],
                  named: dict[str, exp.Expression]) -> AICall:
    """AI_EXTRACT(text, response_format [, options]), positional or named (text =>, responseFormat =>): the
    response format is {'field': 'question', ...}, a list of questions (each its own field) or
    {'schema': <JSON schema>}; the answer is JSON with those fields."""
    for key in ("text", "responseformat"):
        if key in named:
            positional.insert(0 if key == "text" else 1, named.pop(key))
    if named:
        raise InvalidArgument(f"{name} has no argument named {next(iter(named))!r}{position(call)}")
    if len(positional) not in (2, 3):
        raise InvalidArgument(f"{name} takes a text, a response format and optional options{position(call)}")
    fields = constant(positional[1], name, call)
    keys = [p.this.name for p in positional[1].expressions] if isinstance(positional[1], exp.Struct) else \
        fields if isinstance(fields, list) else []
    twice = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if twice is not None:
        raise InvalidArgument(f"{name}'s response format names {twice!r} twice{position(call)}")
    if isinstance(fields, list) and all(isinstance(q, str) for q in fields):
        fields = {q: q for q in fields}
    if isinstance(fields, dict) and set(fields) == {"schema"} and isinstance(fields["schema"], dict):
        schema, template = fields["schema"], "Extract from {0} the values this JSON schema asks for."
    elif isinstance(fields, dict) and fields and all(isinstance(q, str) for q in fields.values()):
        schema = {"type": "object", "additionalProperties": False, "required": list(fields),
                  "properties": {k: {"type": "string", "maxLength": EXTRACT_ANSWER_CHARS} for k in fields}}
        template = "Extract from {0} the answer to each question:" + "".join(f"\n- {k}: {q}" for k, q in fields.items())
    else:
        raise InvalidArgument(f"{name}'s response format must be {{'field': 'question', ...}}, a list of questions "
                              f"or {{'schema': <JSON schema>}}{position(call)}")
    options = constant(positional[2], name, call) if len(positional) == 3 else {}
    if not isinstance(options, dict):
        raise InvalidArgument(f"{name}'s options must be an object such as {{'max_tokens': 100}}{position(call)}")
    enough = 16 + (EXTRACT_ANSWER_CHARS + 10) * len(schema.get("properties", {})) if "schema" not in fields else None
    defaults = {"max_tokens": enough} if enough else {}
    generation = generation_options({**defaults, **options, "response_format": schema}, None, name, call)
    return AICall(name, "complete", template, (positional[0],), answers="text", generation=generation)
