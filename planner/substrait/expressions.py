"""SQL expressions (sqlglot trees, DuckDB dialect) as typed Substrait expressions over a relation's columns."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from sqlglot import exp
from substrait.algebra_pb2 import AggregateFunction, AggregationPhase, Expression, FunctionArgument, FunctionOption, \
    Rel, SortField
from substrait.type_pb2 import Type

from quail.engine.errors import InvalidArgument, Unimplemented

from quail.planner.substrait.functions import CLASSIFY_JSON, Extensions
from quail.planner.substrait.types import INTEGERS, STRINGS, common, describe, from_sql, kind, of, same

E = Expression
ALL = AggregateFunction.AGGREGATION_INVOCATION_ALL
DISTINCT = AggregateFunction.AGGREGATION_INVOCATION_DISTINCT
ONE_PHASE = AggregationPhase.AGGREGATION_PHASE_INITIAL_TO_RESULT
_COMPARISONS = {exp.EQ: "equal", exp.NEQ: "not_equal", exp.LT: "lt", exp.LTE: "lte", exp.GT: "gt", exp.GTE: "gte",
                exp.NullSafeEQ: "is_not_distinct_from", exp.NullSafeNEQ: "is_distinct_from"}
_ARITHMETIC = {exp.Add: "add", exp.Sub: "subtract", exp.Mul: "multiply", exp.Div: "divide", exp.IntDiv: "divide",
               exp.Mod: "modulus"}
_SCALARS = {exp.Lower: "lower", exp.Upper: "upper", exp.Length: "char_length", exp.Abs: "abs"}
AGGREGATES = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max",
              exp.AnyValue: "any_value"}
_INT_LIMITS = {"i8": 2 ** 7, "i16": 2 ** 15, "i32": 2 ** 31, "i64": 2 ** 63}
SORT_DIRECTIONS = {  # (descending, NULLs first): the direction
    (False, True): SortField.SORT_DIRECTION_ASC_NULLS_FIRST, (False, False): SortField.SORT_DIRECTION_ASC_NULLS_LAST,
    (True, True): SortField.SORT_DIRECTION_DESC_NULLS_FIRST, (True, False): SortField.SORT_DIRECTION_DESC_NULLS_LAST}
CLASSIFY_LABEL_PATH = "'$.labels[0]'"


@dataclass(frozen=True)
class Column:
    """A column an expression can name: the table alias it is reachable by (None: none), its name and type."""

    qualifier: str | None
    name: str
    type: Type


@dataclass(frozen=True)
class Relation:
    """A Substrait relation tree and its output columns."""

    rel: Rel
    columns: list[Column]

    def qualified(self, qualifier: str | None, names: list[str] | None = None) -> Relation:
        """The relation with its columns reachable through a table alias (and renamed, when names are given)."""
        names = (names or []) + [c.name for c in self.columns[len(names or []):]]
        return Relation(self.rel, [Column(qualifier, n, c.type) for n, c in zip(names, self.columns)])


@dataclass(frozen=True)
class Typed:
    """A Substrait expression and its type."""

    expression: Expression
    type: Type

    @property
    def literal(self) -> str | None:
        """The kind of literal it is ("null", "string", "i32", ...), None for other expressions."""
        return self.expression.literal.WhichOneof("literal_type") if self.expression.HasField("literal") else None

    @property
    def field(self) -> int | None:
        """The input position it reads, when it is a plain field reference."""
        return field_position(self.expression)


@dataclass
class Scope:
    """The columns an expression may name, by position.

    (a subquery's also those of the scopes it is in);
    after grouping, also the expressions computed already (grouping keys and aggregates: position by their
    `key` in the scope before grouping)."""

    columns: list[Column]
    computed: dict[str, int] = field(default_factory=dict)
    before: Scope | None = None
    outer: Scope | None = None  # a subquery's: the scope of the expression it is in
    ctes: dict = field(default_factory=dict)  # the CTEs a subquery inside the expression may read

    def find(self, column: exp.Column) -> int | None:
        """The position a column reference names, None when it names none; ambiguous: InvalidArgument."""
        name, table = column.name.lower(), column.table.lower()
        hits = [i for i, c in enumerate(self.columns)
                if c.name.lower() == name and (not table or (c.qualifier or "").lower() == table)]
        if len(hits) > 1:
            raise InvalidArgument(f"Substrait export: the column reference {column.sql('duckdb')} is ambiguous")
        return hits[0] if hits else None

    def key(self, node: exp.Expression) -> str:
        """An expression's identity: its SQL with each column it names replaced by the column's position."""
        def positional(n: exp.Expression) -> exp.Expression:
            found = self.find(n) if isinstance(n, exp.Column) and not isinstance(n.this, exp.Star) else None
            return exp.Var(this=f"#{found}") if found is not None else n

        return node.copy().transform(positional).sql("duckdb")


def field_position(expression: Expression, root: str = "root_reference") -> int | None:
    """The position a plain field reference reads (None: not one) of the input (or, with root
    "outer_reference", of an enclosing query's input)."""
    if not expression.HasField("selection") or not expression.selection.HasField(root):
        return None
    selection = expression.selection
    segment = selection.direct_reference.struct_field
    return segment.field if selection.HasField("direct_reference") and not segment.HasField("child") else None


def field_ref(position: int, steps_out: int = 0) -> Expression:
    """A reference to a column of the input, or (steps_out > 0) of the input of an enclosing query."""
    segment = E.ReferenceSegment(struct_field=E.ReferenceSegment.StructField(field=position))
    if steps_out:
        return E(selection=E.FieldReference(direct_reference=segment,
                                            outer_reference=E.FieldReference.OuterReference(steps_out=steps_out)))
    return E(selection=E.FieldReference(direct_reference=segment, root_reference=E.FieldReference.RootReference()))


def literal(kind_: str, value: object, **params: int) -> Typed:
    """A non-NULL literal of a simple kind ("string", "i64", "fp64", "boolean", ...)."""
    type_kind = "bool" if kind_ == "boolean" else kind_
    return Typed(E(literal=E.Literal(**{kind_: value})), of(type_kind, nullable=False, **params))


def null(type_: Type) -> Typed:
    return Typed(E(literal=E.Literal(null=type_, nullable=True)), type_)


def decimal(unscaled: int, precision: int, scale: int) -> Typed:
    value = E.Literal.Decimal(value=unscaled.to_bytes(16, "little", signed=True), precision=precision, scale=scale)
    return Typed(E(literal=E.Literal(decimal=value)), of("decimal", nullable=False, precision=precision, scale=scale))


def number(text: str, negative: bool = False) -> Typed:
    """A SQL number literal as DuckDB types it: INTEGER, BIGINT, DECIMAL(p, s) or DOUBLE."""
    sign = -1 if negative else 1
    if re.fullmatch(r"\d+", text):
        value = sign * int(text)
        for name in ("i32", "i64"):
            if -_INT_LIMITS[name] <= value < _INT_LIMITS[name]:
                return literal(name, value)
        raise Unimplemented(f"Substrait export: the integer {text} is too large")
    whole, dot, fraction = text.partition(".")
    if dot and re.fullmatch(r"\d*", whole) and re.fullmatch(r"\d*", fraction) and len(whole + fraction) <= 38:
        precision = max(1, len(whole.lstrip("0")) + len(fraction))
        return decimal(sign * int(whole + fraction or "0"), precision, len(fraction))
    return literal("fp64", sign * float(text))


def coerce(value: Typed, to: Type) -> Typed:
    """The value as a `to` (a typed NULL, an integer literal of that width, or a CAST)."""
    if same(value.type, to):
        return value
    if value.literal == "null":
        return null(to)
    if value.literal in INTEGERS and kind(to) in INTEGERS:
        number_ = getattr(value.expression.literal, value.literal)
        if -_INT_LIMITS[kind(to)] <= number_ < _INT_LIMITS[kind(to)]:
            return literal(kind(to), number_)
    cast = E.Cast(type=to, input=value.expression, failure_behavior=E.Cast.FAILURE_BEHAVIOR_THROW_EXCEPTION)
    return Typed(E(cast=cast), to)


def unify(values: list[Typed], what: str) -> list[Typed]:
    """The values cast to the type they meet at, as DuckDB casts implicitly; string literals and NULLs
    take the type of the others."""
    typed = [v for v in values if v.literal != "null"]
    target: Type | None = None
    for value in [v for v in typed if v.literal != "string"] or typed:
        met = value.type if target is None else common(target, value.type)
        if met is None:
            raise Unimplemented(f"Substrait export: {what} of {describe(target)} and {describe(value.type)} values "
                                f"needs an explicit CAST")
        target = met
    return values if target is None else [coerce(v, target) for v in values]


def sort_field(value: Typed, ordered: exp.Ordered) -> SortField:
    return SortField(expr=value.expression,
                     direction=SORT_DIRECTIONS[bool(ordered.args.get("desc")), bool(ordered.args.get("nulls_first"))])


def classify_label(node: exp.Expression) -> exp.Expression | None:
    """The label inside AI_CLASSIFY's SQL value, CAST(TO_JSON({'labels': [label]}) AS JSON); else None."""
    if not (isinstance(node, exp.Cast) and node.to.is_type(exp.DataType.Type.JSON)
            and isinstance(node.this, exp.Anonymous) and node.this.name.upper() == "TO_JSON"
            and len(node.this.expressions) == 1 and isinstance(node.this.expressions[0], exp.Struct)):
        return None
    (entry, *rest) = node.this.expressions[0].expressions or [None]
    if rest or not isinstance(entry, exp.PropertyEQ) or entry.name != "labels":
        return None
    labels = entry.expression
    return labels.expressions[0] if isinstance(labels, exp.Array) and len(labels.expressions) == 1 else None


class Expressions:
    """Translates SQL expressions over a scope, declaring the functions they call in the plan's extensions."""

    def __init__(self, functions: Extensions) -> None:
        self.functions = functions
        self.subquery: Callable[[exp.Expression, Scope], Relation] | None = None  # set by the Queries using these
        self._handlers: dict[type, Callable[[exp.Expression, Scope], Typed]] = {
            exp.Paren: lambda n, s: self.translate(n.this, s), exp.Column: self._column, exp.Literal: self._literal,
            exp.Boolean: lambda n, s: literal("boolean", n.this), exp.Null: lambda n, s: null(of("i32")),
            exp.Neg: self._negative, exp.Cast: self._cast, exp.TryCast: self._cast, exp.Not: self._not,
            exp.Is: self._is_null, exp.And: self._connective, exp.Or: self._connective, exp.Like: self._like,
            exp.ILike: self._like, exp.In: self._in, exp.Between: self._between, exp.Case: self._case,
            exp.If: self._case, exp.Coalesce: self._coalesce, exp.DPipe: self._concat, exp.Window: self._window,
            exp.JSONExtractScalar: self._classify_label, exp.Exists: self._exists, exp.Subquery: self._scalar_subquery,
        }
        for family, handler in ((_COMPARISONS, self._compare), (_ARITHMETIC, self._arithmetic),
                                (_SCALARS, self._scalar)):
            self._handlers.update((cls, handler) for cls in family)

    def translate(self, node: exp.Expression, scope: Scope) -> Typed:
        if scope.computed and scope.before is not None:
            position = scope.computed.get(scope.before.key(node))
            if position is not None:
                return Typed(field_ref(position), scope.columns[position].type)
        handler = self._handlers.get(type(node))
        if handler is not None:
            return handler(node, scope)
        if isinstance(node, exp.AggFunc) and type(node) in AGGREGATES:
            raise InvalidArgument(f"Substrait export: the aggregate {node.sql('duckdb')} is not allowed here")
        name = node.name.upper() if isinstance(node, exp.Anonymous) else node.key.upper()
        raise Unimplemented(f"Substrait export: the SQL function or construct {name} is not supported")

    def call(self, name: str, args: list[Typed | str], options: tuple[FunctionOption, ...] = ()) -> Typed:
        """A call of a scalar function; a str argument is an enumeration option."""
        anchor, output = self.functions.resolve(name, [a if isinstance(a, str) else a.type for a in args])
        arguments = [FunctionArgument(enum=a) if isinstance(a, str) else FunctionArgument(value=a.expression)
                     for a in args]
        function = E.ScalarFunction(function_reference=anchor, arguments=arguments, options=options, output_type=output)
        return Typed(E(scalar_function=function), output)

    def aggregate(self, node: exp.AggFunc, scope: Scope) -> tuple[AggregateFunction, Type]:
        """An aggregate call (COUNT(*), COUNT(DISTINCT x), SUM, AVG, MIN, MAX, ANY_VALUE) and its type."""
        name, argument, invocation = AGGREGATES[type(node)], node.this, ALL
        if any(v for k, v in node.args.items() if k not in ("this", "big_int")):
            raise Unimplemented(f"Substrait export: the aggregate {node.sql('duckdb')} is not supported")
        if isinstance(argument, exp.Distinct):
            if len(argument.expressions) != 1:
                raise Unimplemented("Substrait export: DISTINCT over several aggregate arguments is not supported")
            argument, invocation = argument.expressions[0], DISTINCT
        args = [] if argument is None or isinstance(argument, exp.Star) else [self.translate(argument, scope)]
        if name == "avg":  # DuckDB averages in DOUBLE
            args = [coerce(a, of("fp64")) for a in args]
        anchor, output = self.functions.resolve(name, [a.type for a in args])
        arguments = [FunctionArgument(value=a.expression) for a in args]
        function = AggregateFunction(function_reference=anchor, arguments=arguments, output_type=output,
                                     phase=ONE_PHASE, invocation=invocation)
        return function, output

    def _column(self, node: exp.Column, scope: Scope) -> Typed:
        if isinstance(node.this, exp.Star):
            raise InvalidArgument("Substrait export: * is only allowed in a SELECT list and COUNT(*)")
        steps_out, seen = 0, scope
        while seen is not None:
            position = seen.find(node)
            if position is not None:
                return Typed(field_ref(position, steps_out), seen.columns[position].type)
            steps_out, seen = steps_out + 1, seen.outer
        grouped = " (a grouped query reads only its GROUP BY keys and aggregates)" if scope.computed else ""
        raise InvalidArgument(f"Substrait export: column {node.sql('duckdb')} not found{grouped}")

    def _literal(self, node: exp.Literal, scope: Scope) -> Typed:
        return literal("string", node.this) if node.is_string else number(node.this)

    def _negative(self, node: exp.Neg, scope: Scope) -> Typed:
        if isinstance(node.this, exp.Literal) and not node.this.is_string:
            return number(node.this.this, negative=True)
        return self.call("negate", [self.translate(node.this, scope)])

    def _cast(self, node: exp.Cast, scope: Scope) -> Typed:
        label = classify_label(node)
        if label is not None:
            return self.call(CLASSIFY_JSON, [self._string(label, scope)])
        value, to = self.translate(node.this, scope), from_sql(node.to)
        if same(value.type, to) or value.literal == "null":
            return coerce(value, to)
        failure = E.Cast.FAILURE_BEHAVIOR_RETURN_NULL if isinstance(node, exp.TryCast) else \
            E.Cast.FAILURE_BEHAVIOR_THROW_EXCEPTION
        return Typed(E(cast=E.Cast(type=to, input=value.expression, failure_behavior=failure)), to)

    def _classify_label(self, node: exp.JSONExtractScalar, scope: Scope) -> Typed:
        label = classify_label(node.this)
        if label is None or node.expression.sql("duckdb") != CLASSIFY_LABEL_PATH:
            raise Unimplemented("Substrait export: JSON paths are not supported (but for AI_CLASSIFY's :labels[0])")
        return self._string(label, scope)

    def _string(self, node: exp.Expression, scope: Scope) -> Typed:
        value = self.translate(node, scope)
        if kind(value.type) not in STRINGS:
            raise InvalidArgument(f"Substrait export: {node.sql('duckdb')} must be a string, "
                                  f"not {describe(value.type)}")
        return value

    def condition(self, node: exp.Expression, scope: Scope) -> Typed:
        """A boolean expression (a NULL literal: a boolean NULL)."""
        value = self.translate(node, scope)
        if value.literal == "null":
            return null(of("bool"))
        if kind(value.type) != "bool":
            raise InvalidArgument(f"Substrait export: {node.sql('duckdb')} must be a boolean, "
                                  f"not {describe(value.type)}")
        return value

    def _compare(self, node: exp.Binary, scope: Scope) -> Typed:
        pair = unify([self.translate(node.this, scope), self.translate(node.expression, scope)], "a comparison")
        return self.call(_COMPARISONS[type(node)], pair)

    def _arithmetic(self, node: exp.Binary, scope: Scope) -> Typed:
        pair = unify([self.translate(node.this, scope), self.translate(node.expression, scope)], "arithmetic")
        if isinstance(node, exp.IntDiv) and kind(pair[0].type) not in INTEGERS:
            raise Unimplemented("Substrait export: // of other than integers is not supported")
        if isinstance(node, exp.Div) and kind(pair[0].type) not in ("fp32", "fp64"):
            pair = [coerce(v, of("fp64")) for v in pair]  # DuckDB's / divides in DOUBLE
        return self.call(_ARITHMETIC[type(node)], pair)

    def _scalar(self, node: exp.Func, scope: Scope) -> Typed:
        if any(v for k, v in node.args.items() if k != "this"):
            raise Unimplemented(f"Substrait export: {node.sql('duckdb')} is not supported")
        return self.call(_SCALARS[type(node)], [self.translate(node.this, scope)])

    def _connective(self, node: exp.Connector, scope: Scope) -> Typed:
        return self.call(node.key, [self.condition(n, scope) for n in node.flatten()])

    def _not(self, node: exp.Not, scope: Scope) -> Typed:
        inner = node.this.unnest()
        if isinstance(inner, exp.Is) and isinstance(inner.expression, exp.Null):
            return self.call("is_not_null", [self.translate(inner.this, scope)])
        return self.call("not", [self.condition(inner, scope)])

    def _is_null(self, node: exp.Is, scope: Scope) -> Typed:
        if not isinstance(node.expression, exp.Null):
            raise Unimplemented(f"Substrait export: IS {node.expression.sql('duckdb')} is not supported (but IS NULL)")
        return self.call("is_null", [self.translate(node.this, scope)])

    def _like(self, node: exp.Like | exp.ILike, scope: Scope) -> Typed:
        if node.args.get("escape"):
            raise Unimplemented("Substrait export: LIKE ... ESCAPE is not supported")
        sensitivity = "CASE_INSENSITIVE" if isinstance(node, exp.ILike) else "CASE_SENSITIVE"
        options = (FunctionOption(name="case_sensitivity", preference=[sensitivity]),)
        match = self.call("like", [self._string(node.this, scope), self._string(node.expression, scope)], options)
        return self.call("not", [match]) if node.args.get("negate") else match

    def _in(self, node: exp.In, scope: Scope) -> Typed:
        if node.args.get("query") is not None:
            return self._in_query(node, scope)
        if any(node.args.get(k) for k in ("unnest", "field")) or not node.expressions:
            raise Unimplemented("Substrait export: IN is supported over a list of values or a subquery only")
        value, *options = unify([self.translate(n, scope) for n in (node.this, *node.expressions)], "IN")
        found = E(singular_or_list=E.SingularOrList(value=value.expression, options=[o.expression for o in options]))
        return Typed(found, of("bool"))

    def _relation(self, node: exp.Expression, scope: Scope, columns: int | None = None) -> Relation:
        """A subquery's relation (its names resolve in `scope` too), with `columns` columns when given."""
        relation = self.subquery(node.unnest() if isinstance(node, exp.Subquery) else node, scope)
        if columns is not None and len(relation.columns) != columns:
            raise InvalidArgument(f"Substrait export: the subquery {node.sql('duckdb')[:60]} "
                                  f"must give {columns} column")
        return relation

    def _exists(self, node: exp.Exists, scope: Scope) -> Typed:
        predicate = E.Subquery.SetPredicate(predicate_op=E.Subquery.SetPredicate.PREDICATE_OP_EXISTS,
                                            tuples=self._relation(node.this, scope).rel)
        return Typed(E(subquery=E.Subquery(set_predicate=predicate)), of("bool"))

    def _scalar_subquery(self, node: exp.Subquery, scope: Scope) -> Typed:
        relation = self._relation(node, scope, 1)
        return Typed(E(subquery=E.Subquery(scalar=E.Subquery.Scalar(input=relation.rel))), relation.columns[0].type)

    def _in_query(self, node: exp.In, scope: Scope) -> Typed:
        relation = self._relation(node.args["query"], scope, 1)
        needle = self.translate(node.this, scope)
        if not same(needle.type, relation.columns[0].type):
            needle = coerce(needle, relation.columns[0].type)
        predicate = E.Subquery.InPredicate(needles=[needle.expression], haystack=relation.rel)
        return Typed(E(subquery=E.Subquery(in_predicate=predicate)), of("bool"))

    def _between(self, node: exp.Between, scope: Scope) -> Typed:
        if node.args.get("symmetric"):
            raise Unimplemented("Substrait export: BETWEEN SYMMETRIC is not supported")
        value, low, high = unify([self.translate(node.args[k], scope) for k in ("this", "low", "high")], "BETWEEN")
        return self.call("and", [self.call("gte", [value, low]), self.call("lte", [value, high])])

    def _case(self, node: exp.Case | exp.If, scope: Scope) -> Typed:
        clauses = [node] if isinstance(node, exp.If) else node.args.get("ifs") or []
        default = node.args.get("false") if isinstance(node, exp.If) else node.args.get("default")
        operand = node.this if isinstance(node, exp.Case) and node.this is not None else None
        conditions = [self.condition(c.this, scope) if operand is None else
                      self.call("equal", unify([self.translate(operand, scope), self.translate(c.this, scope)],
                                               "a CASE comparison"))
                      for c in clauses]
        *results, otherwise = unify([self.translate(c.args["true"], scope) for c in clauses]
                                    + [self.translate(default, scope) if default is not None else null(of("i32"))],
                                    "CASE results")
        ifs = [E.IfThen.IfClause(**{"if": c.expression, "then": r.expression}) for c, r in zip(conditions, results)]
        return Typed(E(if_then=E.IfThen(ifs=ifs, **{"else": otherwise.expression})), otherwise.type)

    def _coalesce(self, node: exp.Coalesce, scope: Scope) -> Typed:
        values = [self.translate(n, scope) for n in (node.this, *node.expressions)]
        return self.call("coalesce", unify(values, "COALESCE"))

    def _concat(self, node: exp.DPipe, scope: Scope) -> Typed:
        parts = [self.translate(n, scope) for n in node.flatten()]
        return self.call("concat", [v if kind(v.type) in STRINGS else coerce(v, of("string")) for v in parts])

    def _window(self, node: exp.Window, scope: Scope) -> Typed:
        if not isinstance(node.this, exp.RowNumber):
            raise Unimplemented(f"Substrait export: the window function {node.this.sql('duckdb')} is not supported "
                                f"(but ROW_NUMBER())")
        order = node.args.get("order")
        sorts = [sort_field(self.translate(o.this, scope), o) for o in (order.expressions if order else [])]
        anchor, output = self.functions.resolve("row_number", [])
        bound = E.WindowFunction.Bound
        window = E.WindowFunction(
            function_reference=anchor, output_type=output, phase=ONE_PHASE, invocation=ALL, sorts=sorts,
            partitions=[self.translate(p, scope).expression for p in node.args.get("partition_by") or []],
            bounds_type=E.WindowFunction.BOUNDS_TYPE_ROWS, lower_bound=bound(unbounded=bound.Unbounded()),
            upper_bound=bound(current_row=bound.CurrentRow()))
        return Typed(E(window_function=window), output)
