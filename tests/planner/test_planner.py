"""Planning: relational predicates before the model, AI filters bound to templates, errors with positions."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from quail.engine.errors import InvalidArgument, NotFound
from quail.engine.exec.executor import execute, result_schema
from quail.engine.exec.picks import AllColumns, AllOf, AsText, Column, Compare, Picks, RowNumber
from quail.engine.exec.plan import AIFilterChain, AIStep, SQLStep
from quail.engine.exec.relational import DuckDB, StatementSchemas
from quail.engine.exec.catalog import MemoryCatalog
from quail.planner.planner import plan_sql
from quail.planner.statements import plan_statement


@pytest.fixture()
def store():
    tables = MemoryCatalog()
    tables.register("reviews", pa.table({"id": [1, 2], "body": ["good", "bad"], "stars": [5, 1]}))
    return tables


def test_plain_query_is_one_duckdb_step(store):
    plan = plan_sql("SELECT count(*) FROM quail.main.reviews", store)
    assert plan.tables == ("reviews",)
    assert [type(s) for s in plan.steps] == [SQLStep]
    assert "quail" not in plan.steps[0].sql


def test_relational_conjuncts_run_before_the_model(store):
    plan = plan_sql("SELECT id FROM reviews r WHERE r.stars > 3 AND AI_FILTER(PROMPT('Is {0} kind?', r.body)) "
                    "AND id < 10 ORDER BY id LIMIT 5", store)
    first, ai, last = plan.steps
    assert isinstance(first, SQLStep) and "stars > 3" in first.sql and "id < 10" in first.sql
    assert isinstance(ai, AIStep) and ai.kind == "filter" and ai.template == "Is {0} kind?"
    assert ai.input == first.output and ai.layout == "filter"
    assert "AI_FILTER" not in last.sql and "LIMIT 5" in last.sql and "WHERE" not in last.sql
    assert result_schema(plan, store).names == ["id"]


def test_the_final_statement_keeps_the_select_s_comments_and_modifiers(store):
    plan = plan_sql("/* tile 1 */ SELECT DISTINCT id /* the id */ FROM reviews WHERE stars > 1 AND "
                    "AI_FILTER(PROMPT('Is {0} kind?', body)) ORDER BY id LIMIT 2", store)
    assert plan.steps[-1].sql == f'/* tile 1 */ SELECT DISTINCT id /* the id */ FROM "{plan.steps[-2].output}" ' \
                                 f'AS "reviews" ORDER BY id LIMIT 2'


def test_a_final_statement_that_only_picks_columns_says_what_it_picks(store):
    """Taken in Arrow as it runs (tests/planner/test_picks.py): no DuckDB statement for it."""
    plan = plan_sql("SELECT r.id, body AS text FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} kind?', r.body))", store)
    assert plan.steps[-1].picks == Picks(plan.steps[-2].output, (Column("id"), Column("body", "text")))
    assert result_schema(plan, store).names == ["id", "text"]


def test_the_rows_an_ai_step_asks_about_are_picked_in_arrow(store, monkeypatch):
    """A table's rows for its AI step (all columns, row numbers, the arguments as text, where a plain
    condition holds) are taken in Arrow, the result schema too: no DuckDB statement (tests/planner/test_picks.py
    checks them against DuckDB's)."""
    runs: list[str] = []
    monkeypatch.setattr(DuckDB, "run", lambda self, sql, relations, params=None: runs.append(sql))
    monkeypatch.setattr(DuckDB, "schema", lambda self, sql, relations: runs.append(sql))
    plan = plan_sql("SELECT id FROM reviews WHERE id BETWEEN 2 AND 9 AND AI_FILTER(PROMPT('Is {0} kind?', body))",
                    store)
    first = plan.steps[0]
    argument = first.picks.items[2].alias
    assert first.picks == Picks("reviews", (AllColumns(), RowNumber("__quail_rid"), AsText("body", argument)),
                                AllOf((Compare("id", ">=", 2), Compare("id", "<=", 9))))
    assert result_schema(plan, store, schemas=StatementSchemas()).names == ["id"] and runs == []


def test_result_schemas_bind_only_the_statements_not_seen_over_inputs_of_those_schemas(store, monkeypatch):
    """A statement's output schema is remembered with its inputs' schemas: the same projection over another
    range of rows binds only its first statement, the same statement none; a table whose columns changed type
    binds them again and gets the new types; the oldest is forgotten past the size."""
    runs: list[str] = []
    bind = DuckDB.schema
    monkeypatch.setattr(DuckDB, "schema", lambda self, sql, relations: runs.append(sql) or bind(self, sql, relations))
    schemas = StatementSchemas()

    def found(text: str) -> pa.Schema:
        runs.clear()
        return result_schema(plan_sql(text, store), store, schemas=schemas)

    query = ("SELECT id, stars + 1 AS more FROM reviews WHERE stars + 0 < {} "
             "AND AI_FILTER(PROMPT('Is {{0}} kind?', body))")
    assert found(query.format(10)).field("id").type == pa.int64() and len(runs) == 2
    assert found(query.format(20)).field("id").type == pa.int64() and len(runs) == 1 and "20" in runs[0]
    assert found(query.format(20)).names == ["id", "more"] and runs == []
    store.register("reviews", pa.table({"id": ["a"], "body": ["good"], "stars": [5]}), replace=True)
    assert found(query.format(20)) == pa.schema([("id", pa.string()), ("more", pa.int64())]) and len(runs) == 2
    small = StatementSchemas(size=1)
    for text in (query.format(1), query.format(2)):
        result_schema(plan_sql(text, store), store, schemas=small)
    runs.clear()
    result_schema(plan_sql(query.format(1), store), store, schemas=small)
    assert len(runs) == 2


def test_join_condition_is_asked_per_distinct_pair_in_the_join_layout(store):
    plan = plan_sql("SELECT a.id, b.id FROM reviews a JOIN reviews b ON a.stars > b.stars "
                    "AND AI_FILTER(PROMPT('Is {0} kinder than {1}?', a.body, b.body))", store)
    (ai,) = [s for s in plan.steps if isinstance(s, AIStep)]
    assert ai.layout == "join" and ai.kind == "filter"
    combos = next(s for s in plan.steps if s.output == ai.input)
    assert "DISTINCT" in combos.sql
    assert result_schema(plan, store).names == ["id", "id"]


def test_ai_values_become_columns_of_their_table(store):
    plan = plan_sql("SELECT *, AI_SCORE(PROMPT('Is {0} kind?', body)) AS s FROM reviews "
                    "WHERE AI_CLASSIFY(body, ['a', 'b']):labels[0]::string = 'a' ORDER BY s DESC LIMIT 1", store)
    kinds = [s.kind for s in plan.steps if isinstance(s, AIStep)]
    assert sorted(kinds) == ["classify", "score"]
    assert result_schema(plan, store).names == ["id", "body", "stars", "s"]


def test_chained_filters_and_bigquery_ai_if(store):
    plan = plan_sql("SELECT * FROM reviews WHERE AI.IF(('Is ', body, ' about food?')) AND AI.IF(('True? ', body))",
                    store, dialect="bigquery")
    (chain,) = [s for s in plan.steps if isinstance(s, AIFilterChain)]
    ai = chain.filters
    assert chain.limit is None, "two filters over every row: re-ranked after the first rows"
    assert [s.template for s in ai] == ["True? {0}", "Is {0} about food?"], "equal selectivity: the shorter first"
    assert ai[1].input == ai[0].output
    assert result_schema(plan, store).names == ["id", "body", "stars"]


def test_parameters_become_typed_literals(store):
    plan = plan_sql("SELECT * FROM reviews WHERE id = ? AND body <> ?", store, params=[2, "x"])
    assert "id = CAST('2' AS BIGINT)" in plan.steps[0].sql and "'x'" in plan.steps[0].sql
    assert plan.parameters == 2 and plan_sql("SELECT 1", store).parameters == 0
    with pytest.raises(InvalidArgument, match="2 parameter"):
        plan_sql("SELECT * FROM reviews WHERE id = ? AND body <> ?", store, params=[2])


@pytest.mark.parametrize("sql, error, message", [
    ("SELECT * FROM reviews WHERE", InvalidArgument, "line 1, column"),
    ("SELECT * FROM missing", NotFound, "'missing' does not exist at line 1, column 21"),
    ("SELECT * FROM other.reviews", NotFound, "schema 'other'"),
    ("SELECT * FROM reviews WHERE AI_FILTER(PROMPT('{0} and {1}', body))", InvalidArgument, "uses {1}"),
    ("SELECT * FROM reviews WHERE AI_FILTER(PROMPT('no holes', body))", InvalidArgument, "argument 1 has no"),
    ("SELECT * FROM reviews WHERE AI_FILTR(body)", InvalidArgument, "unknown AI function AI_FILTR"),
    ("SELECT * FROM reviews WHERE AI_FILTER(PROMPT('{0}', body), {'anchor': 1})", InvalidArgument,
     "anchor must name a placeholder, 0 to 0, not 1"),
    ("SELECT * FROM reviews WHERE AI_FILTER(PROMPT('{0}', body), {'temperature': 1})", InvalidArgument,
     "options must be"),
    ("SELECT * FROM reviews WHERE AI_FILTER(PROMPT('{0}', body), {'selectivity': 2})", InvalidArgument,
     "selectivity must be in"),
    ("SELECT AI_CLASSIFY(body, 'a') FROM reviews", InvalidArgument, "list of string literals"),
    ("SELECT AI_CLASSIFY(body, ['a', 'b'], {'answers': 'emoji'}) FROM reviews", InvalidArgument,
     "config must be {'answers': 'letters' | 'names'}"),
    ("SELECT AI_SIMILARITY(body) FROM reviews", InvalidArgument, "compares two values"),
    ("SELECT * FROM reviews WHERE AI_FILTER(PROMPT('{0}', AI_CLASSIFY(body, ['a'])))", InvalidArgument,
     "cannot be nested"),
    ("SELECT * FROM reviews WHERE AI_FILTER(body)", InvalidArgument, "expects PROMPT"),
    ("DELETE FROM reviews", InvalidArgument, "only queries"),
    ("SELECT 1; SELECT 2", InvalidArgument, "one SQL statement"),
])
def test_errors_name_the_problem(store, sql, error, message):
    with pytest.raises(error, match=message.replace("{", r"\{").replace("}", r"\}")):
        plan_sql(sql, store)


def test_unknown_column_is_invalid_argument(store):
    plan = plan_sql("SELECT nope FROM reviews", store)
    with pytest.raises(InvalidArgument, match="nope"):
        result_schema(plan, store)


def test_a_table_read_with_its_columns_renamed_is_asked_by_its_new_names(session):
    """FROM reviews AS r(i, text): AI calls and conditions read the renamed columns, qualified or not, and
    give the rows the stored names give; naming more columns than the table has is INVALID_ARGUMENT."""
    plain = session.sql("SELECT id, stars FROM reviews WHERE id > 0 AND AI_FILTER(PROMPT('Is {0} about the food?', "
                        "body)) ORDER BY id").collect()
    for text in ("SELECT i AS id, stars FROM reviews AS r(i, text) WHERE i > 0 AND "
                 "AI_FILTER(PROMPT('Is {0} about the food?', text)) ORDER BY i",
                 "SELECT r.i AS id, r.stars FROM reviews AS r(i, text) WHERE r.i > 0 AND "
                 "AI_FILTER(PROMPT('Is {0} about the food?', r.text)) ORDER BY r.i"):
        assert session.sql(text).collect().equals(plain), text
    with pytest.raises(InvalidArgument, match="4 columns specified"):
        session.sql("SELECT i FROM reviews AS r(i, text, s, x) WHERE AI_FILTER(PROMPT('{0}', text))").collect()


def test_filters_run_in_rank_order(store):
    """The filter removing the most rows per unit of cost runs first, whatever the order in the query."""
    sql = ("SELECT * FROM reviews WHERE AI_FILTER(PROMPT('Is {0} long?', body), {'selectivity': 0.9}) "
           "AND AI_FILTER(PROMPT('Is {0} about food?', body), {'selectivity': 0.1})")
    (chain,) = [s for s in plan_sql(sql, store).steps if isinstance(s, AIFilterChain)]
    assert [s.selectivity for s in chain.filters] == [0.1, 0.9]


def test_explain_through_sql(store):
    plan = plan_sql("EXPLAIN SELECT * FROM reviews WHERE AI_FILTER(PROMPT('Is {0} long?', body)) LIMIT 2", store)
    lines = execute(plan, store, None).column("plan").to_pylist()
    assert any(line.startswith("AI filters until 2 rows pass") for line in lines)
    assert lines[-1].startswith("DuckDB -> __quail_result")
    with pytest.raises(NotFound, match="line 1, column 29"):  # positions count the EXPLAIN too
        plan_sql("EXPLAIN SELECT * FROM nowhere", store)


def test_explain_says_when_the_other_anchor_is_cheaper():
    from quail.engine.exec.catalog import MemoryCatalog

    catalog = MemoryCatalog()
    catalog.register("claims", pa.table({"id": list(range(40)), "claim": ["Tea helps."] * 40}))
    catalog.register("passages", pa.table({"id": list(range(5)), "passage": ["A long study of tea. " * 40] * 5}))
    sql = ("SELECT c.id, p.id FROM claims c JOIN passages p "
           "ON AI_FILTER(PROMPT('Does {1} support {0}?', c.claim, p.passage)OPTIONS)")
    notes = plan_sql(sql.replace("OPTIONS", ""), catalog).notes
    assert any("anchoring {1} would ask" in n and "add {'anchor': 1}" in n for n in notes)
    assert not any("anchoring" in n for n in plan_sql(sql.replace("OPTIONS", ", {'anchor': 1}"), catalog).notes)


def test_plans_count_the_documents_the_kv_pool_holds_and_explain_shows_them():
    """A view of the KV pool (a fake: three quarters of the passages' documents resident as {1}'s, no claim):
    each AI step expects its share of its anchor documents resident, the join order counts them as read,
    not computed; without a view, no expectation and every document computed."""
    from quail.engine.exec.catalog import MemoryCatalog

    catalog = MemoryCatalog()
    catalog.register("claims", pa.table({"id": list(range(40)), "claim": ["Tea helps."] * 40}))
    catalog.register("passages", pa.table({"id": list(range(5)), "passage": ["A long study of tea. " * 40] * 5}))
    asked = []

    def resident(texts: pa.ChunkedArray, placeholder: int) -> float:
        asked.append((texts.to_pylist(), placeholder))
        return 0.75 if placeholder == 1 and texts[0].as_py().startswith("A long") else 0.0

    join = ("SELECT c.id, p.id FROM claims c JOIN passages p "
            "ON AI_FILTER(PROMPT('Does {1} support {0}?', c.claim, p.passage), {'anchor': 1})")
    cold, warm = plan_sql(join, catalog), plan_sql(join, catalog, resident=resident)
    (step,) = [s for s in warm.steps if isinstance(s, AIStep)]
    assert step.documents == (5 * 210, 0.75 * 5 * 210), "5 passages of 840 characters"
    assert step.describe()[0].endswith("; expects ~788 of 1,050 document tokens resident")
    assert [s.documents for s in cold.steps if isinstance(s, AIStep)] == [None]
    assert "expects" not in "".join(line for s in cold.steps for line in s.describe())
    assert asked == [(["A long study of tea. " * 40] * 5, 1), (["Tea helps."] * 40, 0)], \
        "each column asked once: the anchor's, then the other's (for the advice on the anchor)"
    asked.clear()

    def tokens(note: str, pattern: str) -> float:
        return float(re.search(pattern, note).group(1).replace(",", ""))

    assert abs(tokens(cold.notes[0], r"~([\d,]+) model tokens") - tokens(warm.notes[0], r"~([\d,]+) model tokens")
               - 0.75 * 5 * 210) <= 1
    unanchored = join.replace(", {'anchor': 1}", "")
    advice = [plan_sql(unanchored, catalog, resident=view).notes[-1] for view in (None, resident)]
    assert abs(tokens(advice[0], r"would ask ~([\d,]+)") - tokens(advice[1], r"would ask ~([\d,]+)")
               - 0.75 * 5 * 210) <= 1, "the advice on the anchor counts the resident passages too"
    filtered = plan_sql("EXPLAIN SELECT id FROM claims WHERE id < 20 AND AI_FILTER(PROMPT('Is {0} true?', claim)) "
                        "AND AI_FILTER(PROMPT('Is {0} about tea?', claim), {'selectivity': 0.5})", catalog,
                        resident=resident)
    lines = execute(filtered, catalog, None).column("plan").to_pylist()
    assert [line.split("; ")[-1] for line in lines if line.startswith("  AI filter")] == [
        "expects ~0 of 10 document tokens resident", "expects ~0 of 2 document tokens resident"], \
        "4 rows pass id < 20 as estimated (0.1 of 40), each of 2.5 tokens; then the 0.2 the first filter passes"
    asked.clear()
    statement = "SELECT id FROM claims WHERE AI_FILTER(PROMPT('Is {0} true?', claim))"
    (step,) = [s for s in plan_statement(statement, catalog, "duckdb", resident=resident).steps
               if isinstance(s, AIStep)]
    assert step.documents is None and asked == [], "a statement planned to run does not look into the pool for it"
    assert plan_statement(join, catalog, "duckdb", resident=resident).notes == warm.notes and len(asked) == 2, \
        "its join order is still priced with the resident documents"
    assert "expects ~0 of" in "".join(
        execute(plan_statement("EXPLAIN " + statement, catalog, "duckdb", resident=resident), catalog, None)
        .column("plan").to_pylist())


@pytest.mark.parametrize("sql, chunked", [
    ("SELECT id, upper(body) AS b FROM reviews WHERE stars > 1 AND AI_FILTER(PROMPT('Is {0} kind?', body))", True),
    ("SELECT id, AI_CLASSIFY(body, ['good', 'bad']) AS c FROM reviews WHERE AI_FILTER(PROMPT('Is {0} kind?', body))",
     True),
    ("SELECT id, AI_FILTER(PROMPT('Is {0} kind?', body)) AS kind FROM reviews", True),
    ("SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} kind?', body)) "
     "AND AI_FILTER(PROMPT('Is {0} long?', body))", True),
    ("SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} kind?', body)) ORDER BY id", False),
    ("SELECT count(*) FROM reviews WHERE AI_FILTER(PROMPT('Is {0} kind?', body))", False),
    ("SELECT DISTINCT stars FROM reviews WHERE AI_FILTER(PROMPT('Is {0} kind?', body))", False),
    ("SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} kind?', body)) LIMIT 1", False),
    ("SELECT id, row_number() OVER () AS n FROM reviews WHERE AI_FILTER(PROMPT('Is {0} kind?', body))", False),
    ("SELECT a.id FROM reviews a JOIN reviews b ON AI_FILTER(PROMPT('Is {0} like {1}?', a.body, b.body))", False),
])
def test_plans_stream_in_chunks_only_when_each_row_stands_alone(store, sql, chunked):
    """One table's rows through AI steps and a tail that maps rows one to one: chunks; anything that
    needs all rows at once (order, aggregates, DISTINCT, LIMIT, windows, joins): whole."""
    plan = plan_sql(sql, store)
    assert plan.chunked is chunked
    assert any("stream in chunks" in line for line in plan_sql("EXPLAIN " + sql, store).steps[0].sql.split("\n")) \
        is chunked


def test_a_statement_of_too_many_tokens_is_refused_before_it_is_parsed():
    """Planning work grows with a statement's tokens: past MAX_TOKENS the text is refused at once
    (RESOURCE_EXHAUSTED); a CASE of thousands of WHENs parses (each WHEN's THEN found without copying the
    rest of the statement)."""
    from quail.engine.errors import ResourceExhausted
    from quail.planner.dialects import MAX_TOKENS, parse_statements

    with pytest.raises(ResourceExhausted, match=f"Quail plans at most {MAX_TOKENS:,}"):
        parse_statements("SELECT id FROM t WHERE id IN (" + ", ".join(str(i) for i in range(MAX_TOKENS // 2)) + ")")
    whens = " ".join(f"WHEN id = {i} THEN {i}" for i in range(5_000))
    (tree,) = parse_statements(f"SELECT CASE {whens} END AS c FROM t")
    assert len(list(tree.walk())) > 20_000
