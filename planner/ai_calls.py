"""Binding AI function calls in a syntax tree: what is asked, of which expressions, answered how.

Snowflake spellings: AI_FILTER(PROMPT('... {0} ...', a, ...) [, {'selectivity': s, 'anchor': k}]),
AI_CLASSIFY(input, ['label', ...]) → OBJECT {"labels": [...]}, AI_SCORE(PROMPT(...)).
BigQuery spellings: AI.IF(('text ', col, ' text')), AI.CLASSIFY(input, ['label', ...]) → STRING,
AI.SCORE(prompt). A prompt is PROMPT('template', args...), a tuple of parts (string
literals are text, other parts documents) or a string literal.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from quail.engine.ai.kinds import SQL_NAMES
from quail.engine.errors import InvalidArgument
from quail.engine.runtime.prompt import placeholders

from quail.planner.binder import is_unbound
from quail.planner.dialects import position

NOT_YET = {"AI_COMPLETE", "AI_AGG", "AI_SIMILARITY", "AI.GENERATE", "AI_SUMMARIZE_AGG"}
KNOWN = set(SQL_NAMES) | NOT_YET
_IGNORED_KWARGS = {"connection_id", "endpoint", "model_params", "model"}
DEFAULT_SELECTIVITY = 0.2  # an AI filter's expected fraction answered yes, without a hint
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

    @property
    def expected_selectivity(self) -> float:
        """The fraction answered yes the plan expects: the query's hint, else DEFAULT_SELECTIVITY."""
        return self.selectivity or DEFAULT_SELECTIVITY


def _function_name(func: exp.Func) -> str:
    return (func.name if isinstance(func, exp.Anonymous) else func.sql_name()).upper()


def ai_name(node: exp.Expression) -> str | None:
    """'AI_FILTER', 'AI.IF', ... when node calls an AI function (known or not), else None."""
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


def _arguments(name: str, call: exp.Expression) -> tuple[list[exp.Expression], dict[str, exp.Expression]]:
    inner = call.expression if isinstance(call, exp.Dot) else call
    positional, named = [], {}
    for arg in _raw_arguments(inner):
        if isinstance(arg, (exp.Kwarg, exp.PropertyEQ)):
            key = arg.this.name.lower()
            if key not in _IGNORED_KWARGS:
                named[key] = arg.expression
        else:
            positional.append(arg)
    return positional, named


def bind(call: exp.Expression) -> AICall:
    """The bound form of an AI call; InvalidArgument names what is wrong and where (a call asks about
    at least one document: a column, or any expression, of each row)."""
    bound = _bind(call)
    if not bound.args:
        raise InvalidArgument(f"{bound.name} asks nothing of the rows: give it a document, as in "
                              f"PROMPT('... {{0}} ...', column){position(call)}")
    return bound


def _bind(call: exp.Expression) -> AICall:
    name = ai_name(call)
    if name in NOT_YET:
        raise InvalidArgument(f"{name} is not supported yet{position(call)}")
    positional, named = _arguments(name, call)
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
    selectivity, anchor = _options(name, positional[1], call, len(args)) if len(positional) == 2 else (None, 0)
    return AICall(name, SQL_NAMES[name], template, args, selectivity=selectivity,
                  anchor=anchor)


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
    answers = _classify_config(name, positional[2], call) if len(positional) == 3 else "letters"
    return AICall(name, "classify", template, args, labels, answers=answers)


def _classify_config(name: str, config: exp.Expression, call: exp.Expression) -> str:
    """{'answers': 'letters' | 'names'}: how the model names its category (default: by letter)."""
    pairs = config.expressions if isinstance(config, exp.Struct) else None
    values = {p.this.name.lower(): p.expression for p in pairs or [] if isinstance(p, exp.PropertyEQ)}
    answers = values.get("answers")
    if not pairs or set(values) != {"answers"} or len(pairs) != 1 or not (
            isinstance(answers, exp.Literal) and answers.is_string and answers.this in ("letters", "names")):
        raise InvalidArgument(f"{name}'s config must be {{'answers': 'letters' | 'names'}}{position(call)}")
    return answers.this


def _options(name: str, options: exp.Expression, call: exp.Expression, documents: int) -> tuple[float | None, int]:
    """{'selectivity': s, 'anchor': k}, either or both: the expected fraction answered yes (0 < s ≤ 1),
    and the placeholder whose document comes first in the prompt, shared by the requests that name it."""
    pairs = options.expressions if isinstance(options, exp.Struct) else None
    values = {}
    for pair in pairs or []:
        if isinstance(pair, exp.PropertyEQ) and isinstance(pair.expression, exp.Literal):
            values[pair.this.name.lower()] = pair.expression
    if not pairs or len(values) != len(pairs) or not set(values) <= {"selectivity", "anchor"} or any(
            v.is_string for v in values.values()):
        raise InvalidArgument(f"{name}'s options must be {{'selectivity': <number>, 'anchor': <placeholder>}}"
                              f"{position(call)}")
    selectivity = float(values["selectivity"].this) if "selectivity" in values else None
    if selectivity is not None and not 0 < selectivity <= 1:
        raise InvalidArgument(f"selectivity must be in (0, 1], not {selectivity}{position(call)}")
    anchor = values["anchor"].this if "anchor" in values else "0"
    if not anchor.isdigit() or int(anchor) >= documents:
        raise InvalidArgument(f"anchor must name a placeholder, 0 to {documents - 1}, not {anchor}{position(call)}")
    return selectivity, int(anchor)


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
