"""Plan steps from an AI core (planner/core.py, after the rules): DuckDB statements and AI steps.

Each table's core becomes a DuckDB statement over the table (its `before`
conditions, row ids, the arguments of its AI calls as text), its AI filters
(a chain where several, or a limit), its AI values and its `after`
conditions; several tables then join as row-id tuples in the core's join
order (planner.py's docstring), AI joins and values asked once per distinct
combination of rows; the final statement runs the rest of the SELECT over the
tuples joined back to the cores.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from sqlglot import exp

from quail.engine.ai.cascade import Targets
from quail.engine.ai.kinds import KINDS
from quail.engine.errors import InvalidArgument
from quail.engine.exec.plan import AIFilterChain, AIStep, JoinChoice, SQLStep, Step
from quail.planner.ai_calls import AICall, ai_calls, ai_name, ancestors
from quail.planner.core import AICore, Condition, Relation, late_where
from quail.planner.dialects import position
from quail.planner.picks import picks_of
from quail.planner.subqueries import Names

ROW_ID = "__quail_rid"
TUPLES = "__quail_t"


def emit(core: AICore, names: Names, result: str) -> list[Step]:
    """The steps computing the core's SELECT into `result` (the SELECT's AI calls replaced, in place, by the
    columns holding their answers)."""
    return _Emitter(core, names, result).steps_of_select()


def _grouped(select: exp.Select) -> bool:
    """Whether a SELECT groups its rows: GROUP BY, or an aggregate (not a window's) in its columns or HAVING."""
    parts = [*select.expressions, select.args.get("having")]
    return bool(select.args.get("group")) or any(
        isinstance(n, exp.AggFunc) and not isinstance(n.parent, exp.Window)
        for part in parts if part is not None for n in part.walk())


def _group_keys(select: exp.Select) -> list[exp.Expression]:
    """The GROUP BY expressions, positions and result column names resolved to the expressions they name."""
    group = select.args.get("group")
    named = {item.alias.lower(): item.this for item in select.expressions if isinstance(item, exp.Alias)}
    keys = []
    for key in group.expressions if group is not None else []:
        if isinstance(key, exp.Literal) and key.is_int and 1 <= int(key.this) <= len(select.expressions):
            key = select.expressions[int(key.this) - 1]
            key = key.this if isinstance(key, exp.Alias) else key
        elif isinstance(key, exp.Column) and not key.table and key.name.lower() in named:
            key = named[key.name.lower()]
        keys.append(key)
    return keys


def _check_grouped(call: exp.Expression, keys: list[exp.Expression]) -> None:
    """InvalidArgument unless every column an AI call outside aggregates reads is a GROUP BY key (or in one)."""
    names = {key.name.lower() for key in keys if isinstance(key, exp.Column)}
    for column in call.find_all(exp.Column):
        within = [column, *ancestors(column)]
        if column.name.lower() not in names and not any(key == node for key in keys for node in within):
            raise InvalidArgument(f"{ai_name(call)} reads column {column.name!r}, which is neither grouped nor "
                                  f"aggregated: add it to GROUP BY{position(column)}")


def _ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def _col(table: str, column: str) -> exp.Column:
    return exp.Column(this=_ident(column), table=_ident(table))


def aliased_table(name: str, alias: str) -> exp.Table:
    return exp.Table(this=_ident(name), alias=exp.TableAlias(this=_ident(alias)))


def _and(terms: list[exp.Expression]) -> exp.Expression | None:
    return exp.and_(*(t.copy() for t in terms)) if terms else None


def _as_text(arg: exp.Expression, name: str) -> exp.Expression:
    """A copy of an AI call's argument cast to text, named `name` (the cast's type built, not parsed)."""
    return exp.alias_(exp.cast(arg, exp.DataType.build(exp.DataType.Type.VARCHAR)), name, quoted=True, copy=False)


def _copied(value: Any) -> Any:
    """An arg of a node copied: an expression, or a list of them (other values as they are)."""
    if isinstance(value, exp.Expression):
        return value.copy()
    return [_copied(item) for item in value] if isinstance(value, list) else value


def _copy_except(node: exp.Expression, skipped: tuple[str, ...]) -> exp.Expression:
    """A copy of `node` (its comments and position too) without the args in `skipped` (the caller sets them
    anew: nothing copied for them)."""
    copy = type(node)(**{key: _copied(value) for key, value in node.args.items() if key not in skipped})
    copy.comments = list(node.comments) if node.comments else None
    copy.meta.update(node.meta)
    return copy


def _picked(query: exp.Expression, output: str) -> SQLStep:
    """A DuckDB step running `query`, a tree of its own that nothing changes after: its picks
    (planner/picks.py), and its SQL written only if needed (the executor takes the rows of a statement that
    picks in Arrow; then none is), from a copy of the tree (DuckDB's generator changes what it writes
    from, and threads may write it at once)."""
    picks = picks_of(query)
    return SQLStep(partial(query.sql, "duckdb") if picks is not None else query.sql("duckdb", copy=False),
                   output, picks)


class _Emitter:
    """Builds one core's steps in order, naming each relation it creates."""

    def __init__(self, core: AICore, names: Names, result: str) -> None:
        self.core = core
        self.select = core.select
        self.names = names
        self.result = result
        self.steps: list[Step] = []
        self.tuple_columns: list[str] = []  # AI values over several tables, columns of the joined tuples

    def _name(self, stem: str) -> str:
        return self.names.fresh(stem)

    def _slot(self, index: int) -> str:
        return f"{TUPLES}_{index}"

    def steps_of_select(self) -> list[Step]:
        core = self.core
        relations = core.relations
        for relation in relations:
            self._core(relation)
        pending = list(core.pending)
        if len(relations) == 1:
            source = exp.From(this=aliased_table(relations[0].core, relations[0].alias))
            joins = []
        else:
            tuples = (self._join(relations, pending, core.orders[0]) if core.pick is None
                      else self._join_choice(relations, pending, core.orders, core.pick))
            for node in list(ai_calls(self.select)):
                if id(node) in core.values and len(core.values[id(node)][0]) > 1:
                    refs, call = core.values[id(node)]
                    column = self._name("ai")
                    tuples = self._ai_value(tuples, relations, refs, call, column)
                    node.replace(self._value_ref(TUPLES, column, call, node))
                    self.tuple_columns.append(column)
            source = exp.From(this=aliased_table(tuples, TUPLES))
            joins = [exp.Join(this=aliased_table(r.core, r.alias), side="LEFT" if r.outer else None,
                              on=exp.EQ(this=_col(r.alias, ROW_ID), expression=_col(TUPLES, self._slot(i))))
                     for i, r in enumerate(relations)]
        final = _copy_except(self.select, ("from_", "joins", "where"))
        final.set("from_", source)
        final.set("joins", joins or None)
        final.set("where", exp.Where(this=_and([c.node for c in core.final])) if core.final else None)
        self._hide_internal_columns(final, relations)
        self.steps.append(_picked(final, self.result))
        return self.steps

    def _core(self, relation: Relation) -> None:
        """Steps computing this table's core: its rows passing every condition on it alone, with its AI
        values as columns."""
        alias, values = relation.alias, self.core.values
        asks = [(call, "filter", "") for call in relation.filters]
        for node in list(ai_calls(self.select)):
            if id(node) in values and values[id(node)][0] == {alias}:
                column = self._name("ai")
                call = values[id(node)][1]
                asks.append((call, KINDS[call.kind].projected, column))
                node.replace(self._value_ref(alias, column, call, node))
                relation.ai_columns.append(column)

        args: list[tuple[str, ...]] = []
        projection: list[exp.Expression] = [exp.Column(this=exp.Star(), table=_ident(alias)),
                                             exp.alias_(exp.Window(this=exp.RowNumber()), ROW_ID, quoted=True)]
        for k, (call, _, _) in enumerate(asks):
            names = tuple(f"__quail_arg_{self.names.count}_{k}_{j}" for j in range(len(call.args)))
            args.append(names)
            projection += [_as_text(a, n) for a, n in zip(call.args, names)]
        current = self._name(f"rows_{alias}")
        query = exp.select(*projection).from_(relation.table.copy(), copy=False)
        if relation.before:
            query = query.where(_and([c.node for c in relation.before]), copy=False)
        filters = [call for call, kind, _ in asks if kind == "filter"]
        if relation.limit is not None and not filters:  # only these rows are asked (limit_into_model)
            query = query.limit(relation.limit, copy=False)
        self.steps.append(_picked(query, current))
        steps, rows = [], self.core.rows_asked(relation)
        for (call, kind, column), names in zip(asks, args):
            output = self._name("ai")
            steps.append(AIStep(current, output, kind, call.template, names, "filter", call.labels,
                                column, call.expected_selectivity, call.anchor, call.answers,
                                self.core.expected_documents(call, rows), call.generation, rows,
                                _targets(call, kind)))
            current = output
            if kind == "filter":
                rows *= call.expected_selectivity
        filters = [s for s in steps if s.kind == "filter"]
        if filters and (relation.limit is not None or len(filters) > 1) and not any(s.targets for s in filters):
            steps = [AIFilterChain.over(filters, relation.limit)] + steps[len(filters):]
        self.steps.extend(steps)
        if relation.after:
            output = self._name(f"core_{alias}")
            query = exp.select(exp.Star()).from_(aliased_table(current, alias), copy=False) \
                .where(_and([c.node for c in relation.after]), copy=False)
            self.steps.append(_picked(query, output))
            current = output
        relation.core = current

    def _value_ref(self, alias: str, column: str, call: AICall, node: exp.Expression) -> exp.Expression:
        """What stands for an AI value's column in the SELECT; in a grouped SELECT, outside an aggregate,
        any row's (its arguments are the group's keys: every row of the group asks the same)."""
        ref = _col(alias, column)
        if self._per_group(node):
            ref = exp.AnyValue(this=ref)
        if call.name == "AI_CLASSIFY":
            label_list = exp.Array(expressions=[ref])
            obj = exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier("labels"), expression=label_list)])
            return exp.Cast(this=exp.Anonymous(this="TO_JSON", expressions=[obj]), to=exp.DataType.build("JSON"))
        if call.generation is not None and call.generation.schema is not None:  # JSON text: a JSON value
            ref = exp.Cast(this=ref, to=exp.DataType.build("JSON"))
        if call.name == "AI.GENERATE":  # BigQuery's STRUCT: the text (or the output_schema's fields and the
            # JSON they came in), and an empty status where it succeeded
            parts = [(field, exp.Cast(this=exp.Anonymous(this="JSON_EXTRACT_STRING", expressions=[
                ref, exp.Literal.string(f"$.{field}")]), to=exp.DataType.build(kind))) for field, kind in call.fields]
            parts += [("full_response" if call.fields else "result", ref), ("status", exp.Literal.string(""))]
            return exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier(field), expression=value)
                                           for field, value in parts])
        return ref

    def _per_group(self, node: exp.Expression) -> bool:
        """Whether an AI value is asked per row but read once per group: in a grouped SELECT, outside any
        aggregate, and not a grouping key itself (GROUP BY ALL groups by every such value). Its arguments
        must then be grouping keys, so every row of a group asks the same (InvalidArgument otherwise)."""
        group = self.select.args.get("group")
        if not _grouped(self.select) or any(isinstance(a, exp.AggFunc) for a in ancestors(node)) or (
                group is not None and group.args.get("all")):
            return False
        keys = _group_keys(self.select)
        if any(key == above for key in keys for above in (node, *ancestors(node))):
            return False
        _check_grouped(node, keys)
        return True

    def _join_choice(self, relations: list[Relation], pending: list[Condition], orders: list[list[int]],
                     pick: Callable[[list[int]], int]) -> str:
        """Each order's join steps, ending in one relation; the executor runs the one `pick` chooses."""
        output = self._name("joined")
        alternatives = []
        for order in orders:
            start = len(self.steps)
            last = self._join(relations, list(pending), order)
            self.steps.append(SQLStep(exp.select(exp.Star()).from_(aliased_table(last, TUPLES)).sql("duckdb"), output))
            alternatives.append(tuple(self.steps[start:]))
            del self.steps[start:]
        pending.clear()
        self.steps.append(JoinChoice(tuple(r.core for r in relations),
                                     tuple(tuple(relations[i].alias for i in o) for o in orders),
                                     tuple(alternatives), output, pick))
        return output

    def _join(self, relations: list[Relation], pending: list[Condition], order: list[int]) -> str:
        """Row-id tuples of the joins in `order`, each condition applied once its tables are joined.

        A LEFT, RIGHT or FULL join matches by its ON conditions, then adds the
        unmatched tuples before (LEFT, FULL) or its unmatched new rows (RIGHT,
        FULL) with NULL slots; WHERE conditions apply to the joined tuples after
        (after the last join when a RIGHT or FULL join may NULL-extend them).
        Slot i always holds relation i's row id, whatever the order.
        """
        first = relations[order[0]]
        current = self._name("tuples")
        self.steps.append(SQLStep(
            exp.select(exp.alias_(_col(first.alias, ROW_ID), self._slot(order[0]), quoted=True))
            .from_(aliased_table(first.core, first.alias)).sql("duckdb"), current))
        late = late_where(relations)
        for k, i in enumerate(order[1:], start=1):
            new, bound = relations[i], {relations[j].alias for j in order[: k + 1]}
            where = [c for c in pending if c.outer_on is None and c.refs <= bound and not (late and c.on is None)]
            on = [c for c in pending if c.outer_on == new.alias]
            if new.side:
                matched = self._extend(current, relations, i, [c for c in on if c.call is None])
                matched = self._apply(matched, relations, [c for c in on if c.call is not None])
                current = self._outer(current, matched, relations, i, order[:k])
                if any(c.call is None for c in where):
                    current = self._filter(current, relations, [c for c in where if c.call is None])
            else:
                current = self._extend(current, relations, i, [c for c in where if c.call is None])
            current = self._apply(current, relations, [c for c in where if c.call is not None])
            for condition in on + where:
                pending.remove(condition)
        if late:
            last = [c for c in pending if c.on is None and c.call is not None]
            current = self._apply(current, relations, last)
            pending[:] = [c for c in pending if c not in last]
        if pending:
            raise InvalidArgument("a condition names tables the query does not join")
        return current

    def _apply(self, tuples: str, relations: list[Relation], conditions: list[Condition]) -> str:
        for condition in conditions:
            tuples = self._ai_join(tuples, relations, condition)
        return tuples

    def _outer(self, before: str, matched: str, relations: list[Relation], i: int, joined: list[int]) -> str:
        """An outer join's tuples: the matched ones, plus the unmatched tuples before with a NULL slot i
        (LEFT, FULL), plus relation i's unmatched rows with NULL slots before (RIGHT, FULL)."""
        new = relations[i]
        if new.side in ("LEFT", "FULL"):
            on = exp.and_(*(exp.NullSafeEQ(this=_col("__quail_m", self._slot(j)),
                                           expression=_col(TUPLES, self._slot(j)))
                            for j in joined))
            query = exp.select(exp.Column(this=exp.Star(), table=_ident(TUPLES)), _col("__quail_m", self._slot(i))) \
                .from_(aliased_table(before, TUPLES)).join(aliased_table(matched, "__quail_m"), on=on, join_type="LEFT")
        else:
            query = exp.select(exp.Star()).from_(aliased_table(matched, TUPLES))
        if new.side in ("RIGHT", "FULL"):
            seen = exp.select("1").from_(aliased_table(matched, "__quail_m")).where(
                exp.EQ(this=_col("__quail_m", self._slot(i)), expression=_col(new.alias, ROW_ID)))
            unmatched = exp.select(
                *(exp.alias_(exp.cast(exp.null(), exp.DataType.build("BIGINT")), self._slot(j), quoted=True)
                  for j in joined),
                exp.alias_(_col(new.alias, ROW_ID), self._slot(i), quoted=True),
            ).from_(aliased_table(new.core, new.alias)).where(exp.not_(exp.Exists(this=seen)))
            query = exp.union(query, unmatched, distinct=False)
        output = self._name("tuples")
        self.steps.append(SQLStep(query.sql("duckdb"), output))
        return output

    def _filter(self, tuples: str, relations: list[Relation], plain: list[Condition]) -> str:
        """The tuples passing plain conditions over the relations joined so far."""
        names = set().union(*(c.refs for c in plain))
        query = exp.select(exp.Column(this=exp.Star(), table=_ident(TUPLES))).from_(aliased_table(tuples, TUPLES))
        query = self._joined_to(query, relations, names).where(_and([c.node for c in plain]))
        output = self._name("tuples")
        self.steps.append(SQLStep(query.sql("duckdb"), output))
        return output

    def _joined_to(self, query: exp.Select, relations: list[Relation], aliases) -> exp.Select:
        """The query joined to the cores of the named relations (all joined already) by their slots."""
        for i, r in enumerate(relations):
            if r.alias in aliases:
                query = query.join(aliased_table(r.core, r.alias), join_type="LEFT" if r.outer else None,
                                   on=exp.EQ(this=_col(r.alias, ROW_ID), expression=_col(TUPLES, self._slot(i))))
        return query

    def _extend(self, tuples: str, relations: list[Relation], i: int, plain: list[Condition]) -> str:
        new = relations[i]
        names = set().union(*(c.refs for c in plain)) if plain else set()
        query = exp.select(exp.Column(this=exp.Star(), table=_ident(TUPLES)),
                           exp.alias_(_col(new.alias, ROW_ID), self._slot(i), quoted=True)) \
            .from_(aliased_table(tuples, TUPLES)).join(aliased_table(new.core, new.alias), join_type="CROSS")
        query = self._joined_to(query, relations, names - {new.alias})
        if plain:
            query = query.where(_and([c.node for c in plain]))
        output = self._name("tuples")
        self.steps.append(SQLStep(query.sql("duckdb"), output))
        return output

    def _combos(self, tuples: str, relations: list[Relation], refs: frozenset, call: AICall
                ) -> tuple[str, list[str], tuple[str, ...]]:
        """A relation of the distinct row combinations an AI call names, with its arguments as text.

        Returns its name, the tuple slots of the relations named, and the argument columns.
        """
        index = {r.alias: i for i, r in enumerate(relations)}
        slots = [self._slot(index[a]) for a in sorted(refs, key=index.get)]
        names = tuple(f"__quail_arg_{self.names.count}_{j}" for j in range(len(call.args)))
        query = exp.select(*(_col(TUPLES, s) for s in slots),
                           *(_as_text(a, n) for a, n in zip(call.args, names))).distinct().from_(
            aliased_table(tuples, TUPLES))
        query = self._joined_to(query, relations, refs)
        combos = self._name("combos")
        self.steps.append(SQLStep(query.sql("duckdb"), combos))
        return combos, slots, names

    def _with_answers(self, tuples: str, answers: str, slots: list[str], join_type: str, extra: list) -> str:
        """The tuples joined to per-combination answers on the slots they share."""
        on = exp.and_(*(exp.EQ(this=_col("__quail_k", s), expression=_col(TUPLES, s)) for s in slots))
        output = self._name("tuples")
        self.steps.append(SQLStep(
            exp.select(exp.Column(this=exp.Star(), table=_ident(TUPLES)), *extra).from_(aliased_table(tuples, TUPLES))
            .join(aliased_table(answers, "__quail_k"), on=on, join_type=join_type).sql("duckdb"), output))
        return output

    def _ai_join(self, tuples: str, relations: list[Relation], condition: Condition) -> str:
        """Ask an AI condition once per distinct row combination it names; keep the tuples answered yes.

        A condition on one table (a WHERE waiting for a RIGHT or FULL join) keeps the filter layout.
        """
        call = condition.call
        combos, slots, names = self._combos(tuples, relations, condition.refs, call)
        kept = self._name("kept")
        layout = "join" if len(condition.refs) > 1 else "filter"
        self.steps.append(AIStep(combos, kept, "filter", call.template, names, layout, (), "",
                                 call.expected_selectivity, call.anchor,
                                 documents=self._anchor_documents(call, condition.refs), targets=call.targets))
        return self._with_answers(tuples, kept, slots, "INNER", [])

    def _ai_value(self, tuples: str, relations: list[Relation], refs: frozenset, call: AICall, column: str) -> str:
        """An AI value over several tables, asked once per distinct row combination: a column of the tuples."""
        combos, slots, names = self._combos(tuples, relations, refs, call)
        answered = self._name("answered")
        self.steps.append(AIStep(combos, answered, KINDS[call.kind].projected, call.template,
                                 names, "join", call.labels, column, call.expected_selectivity,
                                 call.anchor, call.answers, self._anchor_documents(call, refs), call.generation,
                                 targets=_targets(call, KINDS[call.kind].projected)))
        return self._with_answers(tuples, answered, slots, "LEFT", [_col("__quail_k", column)])

    def _anchor_documents(self, call: AICall, refs: frozenset) -> tuple[float, float] | None:
        """A call over row combinations asks about each of its anchor relation's rows at most once: the
        tokens of their documents, and how many are resident (AICore.expected_documents)."""
        return self.core.expected_documents(call, self.core.anchor_relation(call, refs).rows)

    def _hide_internal_columns(self, final: exp.Select, relations: list[Relation]) -> None:
        """Stars of the final projection leave out row ids, tuple slots and AI value columns."""
        every = [ROW_ID] + [c for r in relations for c in r.ai_columns]
        if len(relations) > 1:
            every += [self._slot(i) for i in range(len(relations))] + self.tuple_columns
        by_alias = {r.alias.lower(): r for r in relations}
        for item in final.expressions:
            star = item if isinstance(item, exp.Star) else item.this if (
                isinstance(item, exp.Column) and isinstance(item.this, exp.Star)) else None
            if star is None:
                continue
            if isinstance(item, exp.Column):
                relation = by_alias.get(item.table.lower())
                hidden = [ROW_ID] + (relation.ai_columns if relation else [])
            else:
                hidden = every
            star.set("except_", [exp.column(_ident(h)) for h in hidden])


def _targets(call: AICall, kind: str) -> Targets | None:
    """A call's cascade targets where they are its kind's: a filter's (a condition), a classification's;
    InvalidArgument where a filter's are on a value."""
    if call.targets is not None and kind != call.targets.kind:
        raise InvalidArgument(f"recall and precision targets apply to {call.name} as a condition (WHERE or ON), "
                              f"not as a value")
    return call.targets
