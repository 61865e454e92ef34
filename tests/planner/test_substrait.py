"""Substrait export and import of optimized plans.

Relational plans round-trip through bytes and run in DuckDB with the original
SQL's rows; AI plans, planned again as SQL when imported, run against the real
model (hash decisions, so row sets are non-trivial) asking the original plan's
questions for its rows; hand-written plans get the SQL query's steps, the
planner's rules included; the AI extension YAML declares what the plans call;
errors are clear; and a real server returns `EXPLAIN (FORMAT SUBSTRAIT)` plans
and runs them for the ADBC driver.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager
import pyarrow as pa
import pyarrow.flight as flight
import pytest
import yaml
from google.protobuf.message import Message
from substrait.algebra_pb2 import (ConsistentPartitionWindowRel, Expression, FetchRel, FilterRel, FunctionArgument,
                                   ProjectRel, ReadRel, Rel, RelCommon, RelRoot)
from substrait.extensions.extensions_pb2 import SimpleExtensionDeclaration, SimpleExtensionURN
from substrait.plan_pb2 import Plan, PlanRel
from substrait.type_pb2 import NamedStruct, Type
from substrait_extensions import extensions as standard_extensions

from quail.engine.errors import InvalidArgument, NotFound, Unimplemented
from quail.engine.exec.catalog import MemoryCatalog
from quail.engine.exec.executor import execute
from quail.engine.exec.plan import AIFilterChain, AIStep, JoinChoice, PhysicalPlan
from quail.planner.ai_calls import CLASSIFY_TEMPLATE
from quail.planner.planner import plan_sql
from quail.planner.substrait.consumer import import_plan, parse_plan
from quail.planner.substrait.expressions import field_ref, literal
from quail.planner.substrait.functions import AI_FUNCTIONS, AI_URN, AI_YAML
from quail.planner.substrait.producer import export_plan
from quail.server import sql_messages as sql

KV_SHARED_BY_ITS_TESTS = True
SMALL_MODEL = True  # what these tests check holds for any model's arithmetic (tests/small_model.py)

PEOPLE = pa.table({"id": pa.array([1, 2, 3, 4, 5], pa.int64()), "name": ["ann", "bob", None, "dan", "eve"],
                   "age": pa.array([30, None, 25, 41, 30], pa.int32()), "score": [1.5, 2.25, None, 4.0, 0.5],
                   "city_id": [10, 20, 10, None, 30]})
CITIES = pa.table({"id": [10, 20, 40], "city": ["Oslo", "Rome", "Lima"]})
REVIEWS = pa.table({"id": list(range(8)),
                    "body": ["Great pasta, friendly staff.", "Cold soup from a rude waiter: nothing to discuss.",
                             "Far too expensive.", None, "Lovely garden terrace.", "Booking online was a nightmare.",
                             "Best espresso in town.", "Noisy room, thin walls."],
                    "stars": [5, 1, 2, 3, 4, 1, 5, 2]})
ASPECTS = pa.table({"id": [0, 1], "aspect": ["the food", "the price"]})
O = "{'selectivity': 0.5}"
ASK = f"AI_FILTER(PROMPT('Does {{0}} discuss {{1}}?', r.body, a.aspect), {O})"


@pytest.fixture(scope="module")
def catalog() -> MemoryCatalog:
    tables = MemoryCatalog()
    tables.register("people", PEOPLE)
    tables.register("cities", CITIES)
    return tables


def columns(table: pa.Table) -> list[tuple]:
    return list(zip(*(c.to_pylist() for c in table.columns)))


def rel_kinds(message: Message) -> set[str]:
    """Every relation kind (and expression kind) inside a Substrait message."""
    found = {message.WhichOneof("rel_type")} if isinstance(message, Rel) else set()
    if isinstance(message, Expression):
        found.add(message.WhichOneof("rex_type"))
    for descriptor, value in message.ListFields():
        if descriptor.message_type is not None:
            for item in ([value] if isinstance(value, Message) else value):
                found |= rel_kinds(item)
    return found


# -- relational plans, no model ------------------------------------------------------------

@pytest.mark.parametrize("query, ordered, kinds", [
    ("SELECT id, name FROM people WHERE age > 26 AND name IS NOT NULL", False, {"filter", "read"}),
    ("SELECT p.name, c.city FROM people p JOIN cities c ON p.city_id = c.id", False, {"join"}),
    ("SELECT p.name, c.city FROM people p LEFT JOIN cities c ON p.city_id = c.id", False, {"join"}),
    ("SELECT p.name, c.city FROM people p RIGHT JOIN cities c ON p.city_id = c.id", False, {"join"}),
    ("SELECT p.name, c.city FROM people p FULL OUTER JOIN cities c ON p.city_id = c.id", False, {"join"}),
    ("SELECT p.id, c.id FROM people p CROSS JOIN cities c", False, {"cross"}),
    ("SELECT p.id, c.id FROM people p, cities c WHERE p.city_id = c.id AND c.city LIKE 'O%'", False, {"cross"}),
    ("SELECT age, count(*) AS n, sum(score), avg(age), min(score), max(id) FROM people GROUP BY age", False,
     {"aggregate"}),
    ("SELECT count(*), count(name), count(DISTINCT age) FROM people", False, {"aggregate"}),
    ("SELECT age, count(*) FROM people GROUP BY 1 HAVING count(*) > 1", False, {"aggregate", "filter"}),
    ("SELECT DISTINCT age FROM people ORDER BY age NULLS FIRST", True, {"aggregate", "sort"}),
    ("SELECT name FROM people ORDER BY score DESC LIMIT 2", True, {"sort", "fetch"}),
    ("SELECT name FROM people ORDER BY id LIMIT 2 OFFSET 1", True, {"fetch"}),
    ("SELECT id, CASE WHEN age > 30 THEN 'old' WHEN age IS NULL THEN 'unknown' ELSE 'young' END AS band, "
     "CASE age WHEN 30 THEN 1 ELSE 0 END FROM people", False, {"if_then"}),
    ("SELECT CAST(age AS VARCHAR) AS a, CAST(score AS INTEGER), TRY_CAST(name AS INTEGER) FROM people", False,
     {"cast"}),
    ("SELECT id FROM people WHERE age IN (25, 30) OR name IN ('dan')", False, {"singular_or_list"}),
    ("SELECT id FROM people WHERE age NOT IN (25, 30) AND score BETWEEN 1 AND 5", False, {"singular_or_list"}),
    ("SELECT id, name LIKE '%a%', name NOT LIKE 'a%', name ILIKE 'A%', name || '!', lower(name), length(name) "
     "FROM people", False, {"scalar_function"}),
    ("SELECT id, COALESCE(name, 'nobody'), COALESCE(age, 0) + 1, age IS NOT DISTINCT FROM 30, NOT (age > 30) "
     "FROM people", False, {"scalar_function"}),
    ("SELECT id, age * 2 + 1, age / 4, age // 4, age % 7, -age, score * 1.5, id - 0.25, 3000000000 FROM people",
     False, {"literal"}),
    ("SELECT id, ROW_NUMBER() OVER () AS rn, row_number() OVER (PARTITION BY age ORDER BY id DESC) AS k "
     "FROM people", False, {"window_function"}),
    ("WITH old AS (SELECT * FROM people WHERE age >= 30) SELECT name FROM old ORDER BY name", True, {"sort"}),
    ("SELECT x.n FROM (SELECT name AS n, age FROM people) AS x WHERE x.age < 40", False, {"filter"}),
    ("SELECT id FROM people UNION ALL SELECT id FROM cities ORDER BY id", True, {"set"}),
    ("SELECT id FROM people UNION SELECT id FROM cities", False, {"set"}),
    ("SELECT * EXCLUDE (score) FROM people", False, {"read"}),
    ("SELECT age, count(*) FROM people GROUP BY age ORDER BY count(*) DESC, age", True, {"aggregate", "sort"}),
    ("SELECT id FROM people p WHERE NOT EXISTS (SELECT 1 FROM cities c WHERE c.id = p.city_id AND c.city LIKE 'O%')",
     False, {"subquery"}),
    ("WITH c AS (SELECT id FROM cities) SELECT id, (SELECT max(c.id) FROM c WHERE c.id >= p.city_id) AS m "
     "FROM people p WHERE city_id IN (SELECT id FROM c)", False, {"subquery"}),
])
def test_relational_plan_round_trip(catalog, query, ordered, kinds):
    plan = plan_sql(query, catalog, "duckdb")
    message = export_plan(plan, catalog)
    data = message.SerializeToString()
    assert parse_plan(data) == message
    assert kinds <= rel_kinds(message)
    imported = import_plan(data, catalog)
    want, got = execute(plan, catalog, None), execute(imported, catalog, None)
    assert got.schema.names == want.schema.names
    assert columns(got) == columns(want) if ordered else sorted(map(repr, columns(got))) == sorted(map(repr, columns(want)))


def test_root_names_and_extension_declarations(catalog):
    message = export_plan(plan_sql("SELECT name AS who, age + 1 FROM people WHERE id < 3", catalog, "duckdb"), catalog)
    (root,) = [r.root for r in message.relations if r.HasField("root")]
    assert list(root.names) == ["who", "(age + 1)"]
    urns = {u.extension_urn_anchor: u.urn for u in message.extension_urns}
    declared = {(urns[d.extension_function.extension_urn_reference], d.extension_function.name) for d in message.extensions}
    assert declared == {("extension:io.substrait:functions_comparison", "lt:any_any"),
                        ("extension:io.substrait:functions_arithmetic", "add:i32_i32")}
    assert message.version.minor_number > 0 and message.version.producer == "quail"


def test_a_hand_written_plan_runs(catalog):
    """A plan another producer might write: a read, a filter calling `gt`, an emit; no hints."""
    i64 = Type(i64=Type.I64(nullability=Type.NULLABILITY_NULLABLE))
    text = Type(string=Type.String(nullability=Type.NULLABILITY_NULLABLE))
    read = ReadRel(named_table=ReadRel.NamedTable(names=["people"]),
                   base_schema=NamedStruct(names=["id", "name"], struct=Type.Struct(types=[i64, text])))
    two = Expression(literal=Expression.Literal(i64=2))
    condition = Expression(scalar_function=Expression.ScalarFunction(
        function_reference=7, output_type=Type(bool=Type.Boolean()),
        arguments=[FunctionArgument(value=field_ref(0)), FunctionArgument(value=two)]))
    kept = FilterRel(input=Rel(read=read), condition=condition, common=RelCommon(emit=RelCommon.Emit(output_mapping=[1])))
    plan = Plan(relations=[PlanRel(root=RelRoot(input=Rel(filter=kept), names=["who"]))],
                extension_urns=[SimpleExtensionURN(extension_urn_anchor=3, urn="extension:io.substrait:functions_comparison")],
                extensions=[SimpleExtensionDeclaration(extension_function=SimpleExtensionDeclaration.ExtensionFunction(
                    extension_urn_reference=3, function_anchor=7, name="gt:i64_i64"))])
    result = execute(import_plan(plan.SerializeToString(), catalog), catalog, None)
    assert result.schema.names == ["who"] and sorted(result["who"].to_pylist(), key=str) == [None, "dan", "eve"]
    read.named_table.names[:] = ["nowhere"]
    plan.relations[0].root.input.filter.input.read.CopyFrom(read)
    with pytest.raises(NotFound, match="nowhere"):
        import_plan(plan.SerializeToString(), catalog)


@pytest.mark.parametrize("query, fragment", [
    ("SELECT sum(age) FILTER (WHERE age > 1) FROM people", "FILTER"),
    ("SELECT avg(age) OVER () FROM people", "window function AVG(age)"),
    ("SELECT id FROM people INTERSECT SELECT id FROM cities", "INTERSECT queries"),
    ("SELECT p.id FROM people p JOIN cities c USING (id)", "JOIN cities AS c USING (id)"),
    ("SELECT list_value(1, 2) FROM people", "ARRAY"),
])
def test_unsupported_sql_is_unimplemented_with_a_clear_message(catalog, query, fragment):
    with pytest.raises(Unimplemented, match="Substrait export") as err:
        export_plan(plan_sql(query, catalog, "duckdb"), catalog)
    assert fragment in str(err.value)


def test_bad_bytes_and_unsupported_relations(catalog):
    for data in (b"\xff\xff not a plan", b""):
        with pytest.raises(InvalidArgument, match="Substrait plan"):
            import_plan(data, catalog)
    message = export_plan(plan_sql("SELECT id FROM people ORDER BY id", catalog, "duckdb"), catalog)
    message.relations[0].root.input.CopyFrom(Rel(window=ConsistentPartitionWindowRel()))
    with pytest.raises(Unimplemented, match="window relations are not supported"):
        import_plan(message.SerializeToString(), catalog)


def test_the_extension_yaml_declares_every_function_the_plans_use():
    """Quail's URN points at quail_ai_functions.yaml, whose signatures give the declared names; standard URNs are
    those of Substrait's YAMLs, which define the functions declared."""
    catalog = MemoryCatalog()
    catalog.register("reviews", REVIEWS)
    ours = yaml.safe_load(AI_YAML.read_text())
    assert ours["urn"] == AI_URN
    short = {"string": "str", "i32": "i32", "fp64": "fp64", "list<string>": "list"}
    signatures = {f"{f['name']}:" + "_".join(short.get(a.get("value"), "req") for a in impl["args"])
                  for f in ours["scalar_functions"] for impl in f["impls"]}
    standard = {}
    for path in standard_extensions.__path__:
        for file in Path(path).glob("functions*.yaml"):
            body = yaml.safe_load(file.read_text())
            standard[body["urn"]] = {f["name"] for key in ("scalar_functions", "aggregate_functions",
                                                           "window_functions") for f in body.get(key) or []}
    queries = ["SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} short?', body)) LIMIT 2",
               "SELECT id, AI_CLASSIFY(body, ['a', 'b']) AS c, AI_SCORE(PROMPT('Is {0} kind?', body)) AS s, "
               "AI_FILTER(PROMPT('Is {0} long?', body)) AS b FROM reviews WHERE stars > 1 ORDER BY id"]
    used = set()
    for query in queries:
        message = export_plan(plan_sql(query, catalog), catalog)
        urns = {u.extension_urn_anchor: u.urn for u in message.extension_urns}
        used |= {(urns[d.extension_function.extension_urn_reference], d.extension_function.name)
                 for d in message.extensions}
    assert {name for urn, name in used if urn == AI_URN} <= signatures
    assert {name.split(":")[0] for urn, name in used if urn == AI_URN} == {
        "ai_filter", "ai_classify", "ai_score", "ai_bool", "ai_classify_json"}
    for urn, name in used:
        assert urn == AI_URN or name.split(":")[0] in standard[urn]


# -- AI plans, the real model --------------------------------------------------------------

@pytest.fixture(scope="module")
def session(hash_session):
    return hash_session(reviews=REVIEWS, aspects=ASPECTS)


def ai_steps(plan: PhysicalPlan) -> list[AIStep]:
    """A plan's AI steps, a chain's filters each (a join chosen at run time: its planned order's)."""
    steps = [s for step in plan.steps for s in step.planned()]
    return [a for s in steps for a in (s.filters if isinstance(s, AIFilterChain) else [s]) if isinstance(a, AIStep)]


@pytest.mark.parametrize("query, shape", [
    (f"SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {{0}} a complaint?', body), {O}) ORDER BY id", AIStep),
    (f"SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {{0}} a complaint?', body), {O}) "
     f"AND AI_FILTER(PROMPT('Is {{0}} short?', body), {{'selectivity': 0.9}}) LIMIT 2", AIFilterChain),
    (f"SELECT r.id, a.id FROM reviews r JOIN aspects a ON {ASK} ORDER BY 1, 2", AIStep),
    ("SELECT id, AI_CLASSIFY(body, ['food', 'price', 'service']) AS c FROM reviews ORDER BY id", AIStep),
    ("SELECT AI_CLASSIFY(body, ['food', 'price']):labels[0]::string AS l, count(*) AS n FROM reviews "
     "WHERE body IS NOT NULL GROUP BY l ORDER BY l", AIStep),
    ("SELECT id, AI_SCORE(PROMPT('Is {0} positive?', body)) AS p FROM reviews WHERE stars > 1 ORDER BY id", AIStep),
    (f"SELECT id, CASE WHEN AI_FILTER(PROMPT('Is {{0}} a complaint?', body), {O}) THEN 'bad' ELSE 'ok' END AS v "
     "FROM reviews ORDER BY id", AIStep),
    (f"SELECT r.id, a.id FROM reviews r LEFT JOIN aspects a ON {ASK} ORDER BY 1, 2 NULLS LAST", AIStep),
    (f"SELECT r.id, a.id FROM reviews r RIGHT JOIN aspects a ON {ASK} ORDER BY 2, 1 NULLS LAST", AIStep),
    (f"SELECT id FROM reviews r WHERE NOT EXISTS (SELECT 1 FROM aspects a WHERE {ASK}) ORDER BY id", AIStep),
    (f"SELECT r.id, a.id, b.id FROM reviews r JOIN aspects a ON {ASK} JOIN aspects b "
     f"ON AI_FILTER(PROMPT('Is {{1}} missing from {{0}}?', r.body, b.aspect), {O}) ORDER BY 1, 2, 3", JoinChoice),
    ("SELECT id, AI_COMPLETE(PROMPT('Name the dish in {0}.', body), {'max_tokens': 3, 'stop': ['.']}) AS c "
     "FROM reviews ORDER BY id", AIStep),
], ids=["filter", "chain-limit", "join", "classify", "classify-label", "score", "bool", "left-join", "right-join",
        "correlated-not-exists", "join-choice", "complete"])
def test_ai_plan_round_trip(session, query, shape):
    """The imported plan is planned again as SQL: it asks the same questions and gives the query's rows. The
    layout is advisory: an AI join exported over its row combinations (one relation) is asked in the filter
    layout, so its rows are compared where decisions do not read the prompt's layout (by rule)."""
    planned = session.sql(query)
    assert any(isinstance(s, shape) for s in planned.plan.steps)
    message = export_plan(planned.plan, session.catalog)
    data = message.SerializeToString()
    assert parse_plan(data) == message and AI_URN in {u.urn for u in message.extension_urns}
    imported = import_plan(data, session.catalog)
    asked, replanned = ai_steps(planned.plan), ai_steps(imported)
    assert {(a.kind, a.template) for a in replanned} == {(a.kind, a.template) for a in asked}
    assert {a.layout for a in replanned} == {"filter"}
    decisions = "hash" if all(a.layout == "filter" for a in asked) else "rule"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(session.runtime, "decisions", decisions)
        want, got = planned.run().table, session.execute_substrait(data).table
    assert got.schema.names == want.schema.names and columns(got) == columns(want)
    assert columns(want), "a non-trivial row set"


def pieces(message: Plan) -> tuple[Rel, dict[str, Expression]]:
    """A plan's ReadRel of the stored reviews, and its function calls by name (an AI call by its template), each
    AI call made to read the stored body column (field 1 of the read) itself."""
    names = {d.extension_function.function_anchor: d.extension_function.name.split(":")[0] for d in message.extensions}
    reads, calls = [], {}
    todo: list[Message] = [message]
    while todo:
        node = todo.pop()
        if isinstance(node, Rel) and node.HasField("read"):
            reads.append(node)
        if isinstance(node, Expression) and node.HasField("scalar_function"):
            call = node.scalar_function
            if names[call.function_reference] in AI_FUNCTIONS.values():
                call.arguments[6].value.nested.list.values[0].CopyFrom(field_ref(1))
            calls[call.arguments[0].value.literal.string or names[call.function_reference]] = node
        todo += [item for descriptor, value in node.ListFields() if descriptor.message_type is not None
                 for item in ([value] if isinstance(value, Message) else value)]
    return reads[0], calls


def hand_written(session, query: str, relation: Callable[[Rel, dict[str, Expression]], Rel], names: list[str]) -> Plan:
    """A plan of one relation over the stored reviews (`relation` of its ReadRel and of the calls of the query's
    plan, by name: pieces)."""
    message = parse_plan(session.substrait(query))
    read, calls = pieces(message)
    del message.relations[:]
    message.relations.append(PlanRel(root=RelRoot(input=relation(read, calls), names=names)))
    return message


def emit(*positions: int) -> RelCommon:
    return RelCommon(emit=RelCommon.Emit(output_mapping=positions))


def shape(plan: PhysicalPlan) -> list[tuple]:
    """A plan's steps: an AI step's kind and question, a chain's questions in order and limit, whether a SQL
    step filters rows."""
    return [("chain", [f.template for f in s.filters], s.limit) if isinstance(s, AIFilterChain) else
            (s.kind, s.template) if isinstance(s, AIStep) else ("sql", " WHERE " in s.sql) for s in plan.steps]


def classified(calls: dict[str, Expression]) -> Expression:
    """ai_classify_json of the ai_classify call itself: AI_CLASSIFY's value in one expression."""
    value = Expression()
    value.CopyFrom(calls["ai_classify_json"])
    value.scalar_function.arguments[0].value.CopyFrom(calls[CLASSIFY_TEMPLATE])
    return value


KIND, SHORT = "Is {0} kind?", "Is {0} short?"
TWO_FILTERS = f"AI_FILTER(PROMPT('{KIND}', body)) AND AI_FILTER(PROMPT('{SHORT}', body), {{'selectivity': 0.4}})"


@pytest.mark.parametrize("query, relation, steps", [
    (f"SELECT id, body FROM reviews WHERE AI_FILTER(PROMPT('Is {{0}} a complaint?', body), {O})",
     lambda read, calls: Rel(filter=FilterRel(input=read, condition=calls["Is {0} a complaint?"], common=emit(0, 1))),
     [("sql", False), ("filter", "Is {0} a complaint?"), ("sql", False)]),
    ("SELECT id, AI_SCORE(PROMPT('Is {0} kind?', body)) AS s, AI_FILTER(PROMPT('Is {0} long?', body)) AS b "
     "FROM reviews",
     lambda read, calls: Rel(project=ProjectRel(input=read, expressions=[calls[KIND], calls["Is {0} long?"]],
                                                common=emit(0, 3, 4))),
     [("sql", False), ("score", KIND), ("bool", "Is {0} long?"), ("sql", False)]),
    ("SELECT id, AI_CLASSIFY(body, ['food', 'price']) AS c FROM reviews",
     lambda read, calls: Rel(project=ProjectRel(input=read, expressions=[classified(calls)], common=emit(0, 3))),
     [("sql", False), ("classify", CLASSIFY_TEMPLATE), ("sql", False)]),
    (f"SELECT id FROM reviews WHERE {TWO_FILTERS} AND stars > 1",
     lambda read, calls: Rel(filter=FilterRel(condition=calls["gt"], common=emit(0), input=Rel(filter=FilterRel(
         condition=calls[SHORT], input=Rel(filter=FilterRel(input=read, condition=calls[KIND])))))),
     [("sql", True), ("chain", [KIND, SHORT], None), ("sql", False)]),
    (f"SELECT id FROM reviews WHERE {TWO_FILTERS} LIMIT 2",
     lambda read, calls: Rel(fetch=FetchRel(count_expr=literal("i64", 2).expression, common=emit(0), input=Rel(
         filter=FilterRel(condition=calls[KIND], input=Rel(filter=FilterRel(input=read, condition=calls[SHORT])))))),
     [("sql", False), ("chain", [KIND, SHORT], 2), ("sql", False)]),
], ids=["filter-keeps-its-document", "two-ai-values-in-one-project", "classify-value",
        "relational-condition-above-ai-filters", "limit-above-ai-filters"])
def test_hand_written_ai_plans(session, query, relation, steps):
    """A hand-written plan is planned as its SQL query is, in whatever order its relations are written: the
    rules run on it (a relational condition above AI filters runs before the model, in the first statement;
    the AI filters are asked cheapest first, as one chain; a limit above them stops the chain once enough
    rows passed). The same steps as SQL's, streamed alike; the same rows."""
    planned = session.sql(query)
    want = planned.run().table
    message = hand_written(session, query, relation, want.schema.names)
    imported = import_plan(message.SerializeToString(), session.catalog)
    assert shape(imported) == shape(planned.plan) == steps and imported.chunked == planned.plan.chunked
    assert sorted(columns(session.execute_substrait(message.SerializeToString()).table)) == sorted(columns(want))


def test_ai_function_arguments_are_checked(session):
    message = parse_plan(session.substrait("SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} bad?', body))"))
    message.relations[1].rel.filter.condition.scalar_function.arguments[1].enum = "sideways"
    with pytest.raises(InvalidArgument, match="ai_filter: bad layout 'sideways'"):
        import_plan(message.SerializeToString(), session.catalog)


# -- a real server, real clients -----------------------------------------------------------

@pytest.fixture(scope="module")
def conn(server):
    with flight_sql.connect(server.uri, autocommit=True) as c:
        with c.cursor() as cur:
            cur.adbc_ingest("reviews", REVIEWS, mode="create")
            cur.adbc_ingest("aspects", ASPECTS, mode="create")
        yield c


def fetch(conn, operation: str | bytes) -> pa.Table:
    with conn.cursor() as cur:
        cur.execute(operation)
        return cur.fetch_arrow_table()


@pytest.mark.parametrize("query", [
    "SELECT stars, count(*) AS n FROM reviews GROUP BY stars ORDER BY stars DESC",
    f"SELECT r.id AS review, a.id AS aspect FROM reviews r JOIN aspects a ON {ASK} ORDER BY 1, 2",
])
def test_explain_substrait_and_execute_it_through_adbc(conn, query):
    explained = fetch(conn, f"EXPLAIN (FORMAT SUBSTRAIT) {query}")
    assert explained.schema == pa.schema([("plan", pa.binary())]) and explained.num_rows == 1
    data = explained["plan"][0].as_py()
    assert parse_plan(data).relations
    assert fetch(conn, data) == fetch(conn, query)


def test_server_says_it_runs_substrait_and_rejects_garbage(server, conn):
    client = flight.FlightClient(server.uri)
    info = client.get_flight_info(flight.FlightDescriptor.for_command(sql.pack(sql.new("CommandGetSqlInfo", info=[5, 6, 7]))))
    table = client.do_get(info.endpoints[0].ticket).read_all()
    values = dict(zip(table["info_name"].to_pylist(), table["value"].to_pylist()))
    assert values[5] is True and values[6] == values[7] and values[6].count(".") == 2
    data = fetch(conn, "EXPLAIN (FORMAT SUBSTRAIT) SELECT id FROM reviews WHERE stars = 5")["plan"][0].as_py()
    command = sql.new("CommandStatementSubstraitPlan", plan=sql.new("SubstraitPlan", plan=data))
    schema = client.get_schema(flight.FlightDescriptor.for_command(sql.pack(command))).schema
    assert schema.names == ["id"]
    client.close()
    with pytest.raises(adbc_driver_manager.ProgrammingError, match="INVALID_ARGUMENT.*Substrait plan"):
        fetch(conn, b"\x08\x96\x01 garbage")
