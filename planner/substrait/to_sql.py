"""Substrait expressions back to DuckDB SQL (sqlglot trees) over an input's columns, with their types.

- Standard functions become DuckDB's operators and functions.
- Quail's AI functions become Quail's own SQL calls (AI_FILTER(PROMPT('...', ...), {...}), AI_SCORE,
  AI_CLASSIFY, AI_COMPLETE), which the planner binds as it binds a query's; a call's layout is advisory.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable, NamedTuple, Sequence

from sqlglot import exp
from substrait.algebra_pb2 import AggregateFunction, AggregationPhase, Expression, FunctionArgument, Rel, SortField
from substrait.type_pb2 import Type

from quail.engine.ai.kinds import DEFAULT_SELECTIVITY, KINDS
from quail.engine.ai.options import Generation
from quail.engine.errors import InvalidArgument, Unimplemented
from quail.engine.runtime.prompt import LAYOUTS

from quail.planner.generation_options import literal_of
from quail.planner.substrait.expressions import SORT_DIRECTIONS, field_position
from quail.planner.substrait.functions import AI_FUNCTIONS, AI_URN, CLASSIFY_JSON, Declared
from quail.planner.substrait.types import INTEGERS, from_arrow, kind, of, to_sql

E = Expression
STANDARD_URN = "extension:io.substrait:"
_BINARY = {"equal": exp.EQ, "not_equal": exp.NEQ, "lt": exp.LT, "lte": exp.LTE, "gt": exp.GT, "gte": exp.GTE,
           "is_not_distinct_from": exp.NullSafeEQ, "is_distinct_from": exp.NullSafeNEQ, "add": exp.Add,
           "subtract": exp.Sub, "multiply": exp.Mul, "modulus": exp.Mod}
_CALLS = {"lower": exp.Lower, "upper": exp.Upper, "char_length": exp.Length, "abs": exp.Abs}
_AGGREGATES = {"sum": exp.Sum, "avg": exp.Avg, "min": exp.Min, "max": exp.Max, "any_value": exp.AnyValue}
_LITERAL_TYPES = {"boolean": "bool", "i8": "i8", "i16": "i16", "i32": "i32", "i64": "i64", "fp32": "fp32",
                  "fp64": "fp64", "string": "string", "date": "date"}
_DIRECTIONS = {direction: order for order, direction in SORT_DIRECTIONS.items()} | {
    SortField.SORT_DIRECTION_UNSPECIFIED: (False, False)}
EPOCH = datetime.date(1970, 1, 1)
_AI_KINDS = {name: kind_ for kind_, name in AI_FUNCTIONS.items()}  # Substrait name → kind
_AI_SQL = {"filter": "AI_FILTER", "bool": "AI_FILTER", "score": "AI_SCORE", "classify": "AI_CLASSIFY",
           "complete": "AI_COMPLETE"}
_ANSWERS = ("letters", "names", "text")
_GENERATION_OPTIONS = ("max_tokens", "temperature", "top_p", "stop")


@dataclass(frozen=True)
class Field:
    """An input column as SQL names it, and its type."""

    sql: exp.Expression
    type: Type


def _paren(node: exp.Expression) -> exp.Expression:
    return exp.Paren(this=node)


class SQLExpressions:
    """Translates a plan's expressions, its functions declared by anchor (`functions`)."""

    def __init__(self, functions: dict[int, Declared],
                 lower: Callable[[Rel], tuple[exp.Select, list[Type]]]) -> None:
        self.functions = functions
        self.lower = lower  # a subquery's relation as a SELECT (and its column types)
        self.outer: list[list[Field]] = []  # the inputs of the expressions the subqueries being translated are in
        self._kinds: dict[str, Callable[[Expression, list[Field]], tuple[exp.Expression, Type]]] = {
            "literal": lambda e, f: literal_sql(e.literal), "selection": self._field, "cast": self._cast,
            "scalar_function": self._function, "if_then": self._if_then, "singular_or_list": self._in,
            "window_function": self._window, "subquery": self._subquery,
        }

    def expression(self, expression: Expression, fields: list[Field]) -> tuple[exp.Expression, Type]:
        rex = expression.WhichOneof("rex_type")
        handler = self._kinds.get(rex or "")
        if handler is None:
            raise Unimplemented(f"Substrait import: {rex or 'empty'} expressions are not supported")
        return handler(expression, fields)

    def sql(self, expression: Expression, fields: list[Field]) -> exp.Expression:
        return self.expression(expression, fields)[0]

    def declared(self, reference: int) -> Declared:
        found = self.functions.get(reference)
        if found is None:
            raise InvalidArgument(f"Substrait import: function anchor {reference} is not declared in the plan")
        return found

    def ordered(self, sort: SortField, fields: list[Field]) -> exp.Ordered:
        if sort.WhichOneof("sort_kind") != "direction" or sort.direction not in _DIRECTIONS:
            raise Unimplemented("Substrait import: sorts by a comparison function or clustered are not supported")
        desc, nulls_first = _DIRECTIONS[sort.direction]
        return exp.Ordered(this=self.sql(sort.expr, fields), desc=desc, nulls_first=nulls_first)

    def aggregate(self, function: AggregateFunction, fields: list[Field]) -> tuple[exp.Expression, Type]:
        """COUNT, SUM, AVG, MIN, MAX or ANY_VALUE of a measure (DISTINCT by its invocation)."""
        declared = self.declared(function.function_reference)
        if not declared.urn.startswith(STANDARD_URN) or declared.base not in ("count", *_AGGREGATES):
            raise Unimplemented(f"Substrait import: the aggregate function {declared.name} is not supported")
        if function.sorts or function.phase not in (AggregationPhase.AGGREGATION_PHASE_UNSPECIFIED,
                                                    AggregationPhase.AGGREGATION_PHASE_INITIAL_TO_RESULT):
            raise Unimplemented("Substrait import: ordered or partial aggregates are not supported")
        args = [self.sql(a.value, fields) for a in function.arguments]
        if function.invocation == AggregateFunction.AGGREGATION_INVOCATION_DISTINCT:
            args = [exp.Distinct(expressions=args)]
        if declared.base == "count":
            return exp.Count(this=args[0] if args else exp.Star()), function.output_type
        return _AGGREGATES[declared.base](this=_one(args, declared)), function.output_type

    def _field(self, expression: Expression, fields: list[Field]) -> tuple[exp.Expression, Type]:
        position = field_position(expression)
        outer = field_position(expression, "outer_reference")
        if outer is not None:
            steps_out = expression.selection.outer_reference.steps_out
            if not 0 < steps_out <= len(self.outer):
                raise InvalidArgument(f"Substrait import: an outer reference {steps_out} steps out of "
                                      f"{len(self.outer)} enclosing queries")
            position, fields = outer, self.outer[-steps_out]
        if position is None:
            raise Unimplemented("Substrait import: field references other than a column of the input or of an "
                                "enclosing query's (nested, masked) are not supported")
        if not 0 <= position < len(fields):
            raise InvalidArgument(f"Substrait import: field {position} is out of range (the input has {len(fields)})")
        return fields[position].sql.copy(), fields[position].type

    def _subquery(self, expression: Expression, fields: list[Field]) -> tuple[exp.Expression, Type]:
        """EXISTS, IN (subquery) with one needle, or a scalar subquery; their relations may read `fields`."""
        subquery = expression.subquery
        kind_ = subquery.WhichOneof("subquery_type")
        needles = [self.sql(n, fields) for n in subquery.in_predicate.needles]
        exists = subquery.set_predicate.predicate_op == E.Subquery.SetPredicate.PREDICATE_OP_EXISTS
        if kind_ not in ("scalar", "in_predicate", "set_predicate") or kind_ == "set_predicate" and not exists or \
                kind_ == "in_predicate" and len(needles) != 1:
            raise Unimplemented("Substrait import: subqueries are supported as EXISTS, IN with one needle, or scalars")
        self.outer.append(fields)
        try:
            rel = {"scalar": subquery.scalar.input, "in_predicate": subquery.in_predicate.haystack,
                   "set_predicate": subquery.set_predicate.tuples}[kind_]
            query, types = self.lower(rel)
        finally:
            self.outer.pop()
        if kind_ == "set_predicate":
            return exp.Exists(this=query), of("bool")
        if len(types) != 1:
            raise InvalidArgument(f"Substrait import: a {kind_} subquery must give one column, not {len(types)}")
        if kind_ == "in_predicate":
            return _paren(exp.In(this=needles[0], query=exp.Subquery(this=query))), of("bool")
        return exp.Subquery(this=query), types[0]

    def _cast(self, expression: Expression, fields: list[Field]) -> tuple[exp.Expression, Type]:
        cast = expression.cast
        value = self.sql(cast.input, fields)
        node = exp.TryCast if cast.failure_behavior == E.Cast.FAILURE_BEHAVIOR_RETURN_NULL else exp.Cast
        return node(this=value, to=to_sql(cast.type)), cast.type

    def _if_then(self, expression: Expression, fields: list[Field]) -> tuple[exp.Expression, Type]:
        if_then = expression.if_then
        clauses = [(self.sql(getattr(c, "if"), fields), self.expression(c.then, fields)) for c in if_then.ifs]
        otherwise = self.expression(getattr(if_then, "else"), fields) if if_then.HasField("else") else None
        if not clauses:
            raise InvalidArgument("Substrait import: an IfThen expression without clauses")
        case = exp.Case(ifs=[exp.If(this=c, true=v) for c, (v, _) in clauses],
                        default=otherwise[0] if otherwise is not None else None)
        return case, clauses[0][1][1]

    def _in(self, expression: Expression, fields: list[Field]) -> tuple[exp.Expression, Type]:
        found = expression.singular_or_list
        options = [self.sql(o, fields) for o in found.options]
        return _paren(exp.In(this=self.sql(found.value, fields), expressions=options)), of("bool")

    def _window(self, expression: Expression, fields: list[Field]) -> tuple[exp.Expression, Type]:
        window = expression.window_function
        declared = self.declared(window.function_reference)
        if declared.base != "row_number" or not declared.urn.startswith(STANDARD_URN):
            raise Unimplemented(f"Substrait import: the window function {declared.name} is not supported")
        order = [self.ordered(s, fields) for s in window.sorts]
        node = exp.Window(this=exp.RowNumber(), partition_by=[self.sql(p, fields) for p in window.partitions] or None,
                          order=exp.Order(expressions=order) if order else None, over="OVER")
        return node, window.output_type

    def _function(self, expression: Expression, fields: list[Field]) -> tuple[exp.Expression, Type]:
        function = expression.scalar_function
        declared = self.declared(function.function_reference)
        if declared.urn == AI_URN and declared.base in _AI_KINDS:
            return self._ai(declared.base, function.arguments, fields)
        if any(a.WhichOneof("arg_type") != "value" for a in function.arguments):
            raise Unimplemented(f"Substrait import: {declared.name} with enumeration or type arguments "
                                f"is not supported here")
        args = [self.expression(a.value, fields) for a in function.arguments]
        standard = declared.urn.startswith(STANDARD_URN)
        if declared.urn == AI_URN and declared.base == CLASSIFY_JSON:
            return _classify_json(_one([a for a, _ in args], declared)), function.output_type
        if not standard:
            raise Unimplemented(f"Substrait import: the function {declared.name} of {declared.urn or 'no URN'} "
                                f"is not supported here")
        return self._standard(declared, function, args), function.output_type

    def _ai(self, name: str, args: Sequence[FunctionArgument], fields: list[Field]) -> tuple[exp.Expression, Type]:
        """ai_<kind>(...) as Quail's SQL call of PROMPT(template, documents...), its options those that differ
        from the defaults; its value typed as the kind's."""
        question = _question(name, args)
        prompt = exp.Anonymous(this="PROMPT", expressions=[exp.Literal.string(question.template),
                                                           *(self.sql(d, fields) for d in question.documents)])
        value = from_arrow(KINDS[KINDS[question.kind].projected].value)
        if question.kind == "classify":
            return _classify(prompt, question), value
        if question.generation is not None:
            return _complete(prompt, question.generation), value
        options = {"selectivity": question.selectivity} if question.selectivity != DEFAULT_SELECTIVITY else {}
        options |= {"anchor": question.anchor} if question.anchor else {}
        return exp.Anonymous(this=_AI_SQL[question.kind], expressions=[prompt, *_struct(options)]), value

    def _standard(self, declared: Declared, function: E.ScalarFunction,
                  args: list[tuple[exp.Expression, Type]]) -> exp.Expression:
        name, values = declared.base, [a for a, _ in args]
        if name in _BINARY and len(values) == 2:
            return _paren(_BINARY[name](this=values[0], expression=values[1]))
        if name == "divide" and len(values) == 2:  # Substrait divides integers as integers; DuckDB's / does not
            node = exp.IntDiv if kind(args[0][1]) in INTEGERS else exp.Div
            return _paren(node(this=values[0], expression=values[1]))
        if name in ("and", "or") and values:
            return _paren(exp.and_(*values) if name == "and" else exp.or_(*values))
        if name in _CALLS:
            return _CALLS[name](this=_one(values, declared))
        unary = {"not": exp.Not, "negate": exp.Neg, "is_null": lambda this: exp.Is(this=this, expression=exp.Null()),
                 "is_not_null": lambda this: exp.Not(this=exp.Is(this=this, expression=exp.Null()))}
        if name in unary:
            return _paren(unary[name](this=_one(values, declared)))
        if name == "coalesce" and values:
            return exp.Coalesce(this=values[0], expressions=values[1:])
        if name == "concat" and values:
            return _paren(exp.DPipe(this=values[0], expression=values[1], safe=True) if len(values) == 2
                          else exp.Concat(expressions=values, safe=True))
        if name == "between" and len(values) == 3:
            return _paren(exp.Between(this=values[0], low=values[1], high=values[2]))
        if name == "like" and len(values) == 2:
            insensitive = any(o.name == "case_sensitivity" and o.preference[:1] == ["CASE_INSENSITIVE"]
                              for o in function.options)
            return _paren((exp.ILike if insensitive else exp.Like)(this=values[0], expression=values[1]))
        raise Unimplemented(f"Substrait import: the function {declared.name} is not supported")


def _one(values: list[exp.Expression], declared: Declared) -> exp.Expression:
    if len(values) != 1:
        raise InvalidArgument(f"Substrait import: {declared.name} takes one argument, not {len(values)}")
    return values[0]


class _Question(NamedTuple):
    """An AI function call's arguments, checked."""

    kind: str
    template: str
    answers: str
    anchor: int
    selectivity: float
    labels: list[str]
    documents: list[Expression]
    generation: Generation | None


def _question(name: str, args: Sequence[FunctionArgument]) -> _Question:
    """The arguments of ai_<kind>(template, layout, answers, anchor, selectivity, labels, documents[, generation]);
    InvalidArgument naming those that are bad. The layout is checked, then left to the planner."""
    kind_ = _AI_KINDS[name]
    generating = kind_ == "complete"
    if len(args) != 7 + generating:
        raise InvalidArgument(f"{name} takes {7 + generating} arguments (template, layout, answers, anchor, "
                              f"selectivity, labels, documents{', generation' if generating else ''}), "
                              f"not {len(args)}")
    template, anchor, selectivity = (_literal(args[i], type_, name) for i, type_ in
                                     ((0, "string"), (3, "i32"), (4, "fp64")))
    layout, answers = args[1].enum, args[2].enum
    labels = [v.string for v in args[5].value.literal.list.values]
    documents = list(args[6].value.nested.list.values)
    listed = (args[5].value.literal.WhichOneof("literal_type") in ("list", "empty_list"),
              args[6].value.nested.WhichOneof("nested_type") == "list")
    problems = [layout not in LAYOUTS and f"layout {layout!r}", answers not in _ANSWERS and f"answers {answers!r}",
                not listed[0] and "labels (a list literal)",
                not (listed[1] and documents) and "documents (a nested list of expressions)",
                not 0 <= anchor < len(documents) and f"anchor {anchor}",
                not 0 < selectivity <= 1 and f"selectivity {selectivity}",
                (kind_ == "classify") != bool(labels) and "labels (classify only)",
                generating != (answers == "text") and f"answers {answers!r} for {name}"]
    problems = [p for p in problems if p]
    if problems:
        raise InvalidArgument(f"{name}: bad {', '.join(problems)}")
    generation = Generation.from_json(_literal(args[7], "string", name)) if generating else None
    return _Question(kind_, template, answers, anchor, selectivity, labels, documents, generation)


def _literal(argument: FunctionArgument, type_: str, function: str) -> Any:
    literal = argument.value.literal
    if argument.WhichOneof("arg_type") != "value" or literal.WhichOneof("literal_type") != type_:
        raise InvalidArgument(f"{function}: expected a {type_} literal argument")
    return getattr(literal, type_)


def _struct(options: dict[str, Any]) -> list[exp.Expression]:
    """An options object ({'key': value, ...}) as a call's last argument; none when there are no options."""
    pairs = [exp.PropertyEQ(this=exp.to_identifier(k), expression=literal_of(v)) for k, v in options.items()]
    return [exp.Struct(expressions=pairs)] if pairs else []


def _classify(prompt: exp.Expression, question: _Question) -> exp.Expression:
    """The label AI_CLASSIFY(prompt, [labels][, {'answers': 'names'}]) chooses: its value's :labels[0]."""
    if question.anchor:
        raise Unimplemented("Substrait import: ai_classify with an anchor other than 0 is not supported")
    call = exp.Anonymous(this="AI_CLASSIFY", expressions=[
        prompt, exp.Array(expressions=[exp.Literal.string(label) for label in question.labels]),
        *_struct({"answers": question.answers} if question.answers != "letters" else {})])
    path = exp.JSONPath(expressions=[exp.JSONPathRoot(), exp.JSONPathKey(this="labels"), exp.JSONPathSubscript(this=0)])
    return exp.JSONExtractScalar(this=call, expression=path)


def _complete(prompt: exp.Expression, generation: Generation) -> exp.Expression:
    """AI_COMPLETE([model,] prompt[, options]): the generation's options that differ from the defaults, its
    schema as the response_format (the answer then text, as ai_complete's is)."""
    defaults = Generation()
    options = {k: getattr(generation, k) for k in _GENERATION_OPTIONS if getattr(generation, k) != getattr(defaults, k)}
    options |= {"response_format": generation.schema} if generation.schema is not None else {}
    model = [exp.Literal.string(generation.model)] if generation.model is not None else []
    call = exp.Anonymous(this="AI_COMPLETE", expressions=[*model, prompt, *_struct(options)])
    return exp.cast(call, "VARCHAR") if generation.schema is not None else call


def _classify_json(label: exp.Expression) -> exp.Expression:
    """AI_CLASSIFY's value as the planner writes it: CAST(TO_JSON({'labels': [label]}) AS JSON)."""
    labels = exp.PropertyEQ(this=exp.to_identifier("labels"), expression=exp.Array(expressions=[label]))
    return exp.Cast(this=exp.Anonymous(this="TO_JSON", expressions=[exp.Struct(expressions=[labels])]),
                    to=exp.DataType.build("JSON"))


def literal_sql(literal: E.Literal) -> tuple[exp.Expression, Type]:
    """A literal as SQL: typed by a CAST where DuckDB would read its text as another type."""
    name = literal.WhichOneof("literal_type")
    if name == "null":
        return exp.Cast(this=exp.Null(), to=to_sql(literal.null)), literal.null
    if name == "decimal":
        value = Decimal(int.from_bytes(literal.decimal.value, "little", signed=True)).scaleb(-literal.decimal.scale)
        type_ = of("decimal", nullable=False, precision=literal.decimal.precision, scale=literal.decimal.scale)
        return exp.Cast(this=exp.Literal.string(str(value)), to=to_sql(type_)), type_
    if name not in _LITERAL_TYPES:
        raise Unimplemented(f"Substrait import: {name or 'empty'} literals are not supported")
    type_ = of(_LITERAL_TYPES[name], nullable=False)
    value = getattr(literal, name)
    if name == "boolean":
        return exp.Boolean(this=value), type_
    if name == "string":
        return exp.Literal.string(value), type_
    if name == "i32":
        return exp.Literal.number(value), type_
    text = (EPOCH + datetime.timedelta(days=value)).isoformat() if name == "date" else repr(value)
    return exp.Cast(this=exp.Literal.string(text), to=to_sql(type_)), type_
