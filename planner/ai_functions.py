"""Binding AI function calls in a syntax tree to the prompt template and argument expressions."""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from quail.engine.errors import InvalidArgument
from quail.engine.prompt import placeholders

from .dialects import position

# Every AI function name Quail knows (snowflake / bigquery spellings), and those it runs today.
KNOWN = {"AI_FILTER", "AI.IF", "AI_CLASSIFY", "AI.CLASSIFY", "AI_SCORE", "AI.SCORE", "AI_COMPLETE", "AI_AGG",
         "AI_SIMILARITY", "AI.GENERATE"}
FILTERS = {"AI_FILTER", "AI.IF"}
_IGNORED_KWARGS = {"connection_id", "endpoint", "model_params"}


@dataclass(frozen=True)
class AIPredicate:
    """A yes/no question over a row: template with {i} placeholders and one expression per placeholder."""

    template: str
    args: tuple[exp.Expression, ...]


def ai_name(node: exp.Expression) -> str | None:
    """'AI_FILTER', 'AI.IF', ... when node calls an AI function (known or not), else None."""
    if isinstance(node, exp.Anonymous) and node.name.upper().startswith("AI_"):
        if not isinstance(node.parent, exp.Dot):
            return node.name.upper()
    if isinstance(node, exp.Dot) and node.this.name.upper() == "AI" and isinstance(node.expression, exp.Func):
        inner = node.expression
        return "AI." + (inner.name if isinstance(inner, exp.Anonymous) else inner.sql_name()).upper()
    return None


def ai_calls(tree: exp.Expression) -> list[exp.Expression]:
    """Every AI function call in the tree, outermost first; unknown AI names are an error."""
    calls = [n for n in tree.walk() if ai_name(n)]
    for call in calls:
        if ai_name(call) not in KNOWN:
            raise InvalidArgument(f"unknown AI function {ai_name(call)}{position(call)}")
    return calls


def contains_ai(node: exp.Expression) -> bool:
    return any(ai_name(n) for n in node.walk())


def _call_args(call: exp.Expression) -> list[exp.Expression]:
    inner = call.expression if isinstance(call, exp.Dot) else call
    return list(inner.expressions)


def bind_filter(call: exp.Expression) -> AIPredicate:
    """AI_FILTER(PROMPT('...{0}...', a, ...)) / AI_FILTER('text') / AI.IF((parts...)) → AIPredicate."""
    name = ai_name(call)
    if name not in FILTERS:
        raise InvalidArgument(f"{name} is not supported here yet{position(call)}")
    args = []
    for arg in _call_args(call):
        if isinstance(arg, exp.Kwarg):
            key = arg.this.name.lower()
            if key == "prompt":
                args.append(arg.expression)
            elif key not in _IGNORED_KWARGS:
                raise InvalidArgument(f"{name} has no argument named {key!r}{position(call)}")
        else:
            args.append(arg)
    if len(args) != 1:
        raise InvalidArgument(f"{name} takes one prompt argument, got {len(args)}{position(call)}")
    return _bind_prompt(name, args[0], call)


def _bind_prompt(name: str, prompt: exp.Expression, call: exp.Expression) -> AIPredicate:
    if isinstance(prompt, exp.Anonymous) and prompt.name.upper() == "PROMPT":
        return _bind_template(prompt)
    if isinstance(prompt, exp.Tuple):
        return _bind_parts(prompt.expressions)
    if isinstance(prompt, exp.Literal) and prompt.is_string:
        return _bind_parts([prompt])
    raise InvalidArgument(
        f"{name} expects PROMPT('... {{0}} ...', column, ...) or a string literal{position(call)}"
    )


def _bind_template(prompt: exp.Anonymous) -> AIPredicate:
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
    return AIPredicate(template, args)


def _bind_parts(parts: list[exp.Expression]) -> AIPredicate:
    """BigQuery's prompt tuple: string literals are text, every other part is a document."""
    template, args = [], []
    for part in parts:
        if isinstance(part, exp.Literal) and part.is_string:
            template.append(part.this)
        else:
            template.append(f"{{{len(args)}}}")
            args.append(part)
    return AIPredicate("".join(template), tuple(args))
