"""AI_FILTER with recall and precision targets over ADBC: a cascade whose rows, set against the exact query's,
meet what its report promises; bad targets refused up front.

The server answers yes/no by `--decisions rule` (a word of the question in the document): the embedded
SmolLM2 answers no to nearly every question, so its exact answers would leave a cascade nothing to find;
the rule's answers are ones an embedding can learn, the forward passes run in full all the same.
"""

from __future__ import annotations

import random
import threading

import pyarrow as pa
import pytest
from adbc_driver_manager import Error as DriverError

import quail
from quail.clients.server_process import ServerProcess
from quail.engine.ai.asking import rule_category, rule_says_yes

QUESTION = "Does {0} mention a kitten?"
PETS = ["kitten", "puppy", "parrot", "goldfish", "hamster", "rabbit", "turtle", "pony"]
PLACES = ["sofa", "garden", "kitchen", "window", "porch", "bed"]
ROWS = 600
TARGETS = "{'recall': 0.7, 'precision': 0.7, 'confidence': 0.7}"
PET_LABELS = ["kitten", "puppy", "parrot", "other"]


def pet(options: str) -> str:
    """The category AI_CLASSIFY gives a note's pet, with these options (", {...}", or "")."""
    return f"AI_CLASSIFY(body, {PET_LABELS}{options}):labels[0]::string"


def notes(count: int, seed: int) -> pa.Table:
    pick = random.Random(seed)
    return pa.table({"id": list(range(count)),
                     "body": [f"The {pick.choice(PETS)} slept by the {pick.choice(PLACES)}." for _ in range(count)]})


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    with ServerProcess(tmp_path_factory.mktemp("data"), "--decisions", "rule") as server:
        with quail.connect(server.uri) as conn, conn.cursor() as cur:
            cur.adbc_ingest("notes", notes(ROWS, 1), mode="replace")
            cur.adbc_ingest("few", notes(40, 2), mode="replace")
        yield server.uri


def rows(uri: str, sql: str) -> list:
    with quail.connect(uri) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


def test_the_cascade_keeps_what_its_report_promises(uri):
    """The rows against the exact query's (the rule's answers, checked against the exact query on a slice):
    recall and precision at least the reported bounds, the estimates near them, fewer rows asked."""
    table = notes(ROWS, 1)
    exact = {i for i, body in enumerate(table["body"].to_pylist()) if rule_says_yes(QUESTION, [body])}
    sliced = rows(uri, f"SELECT id FROM notes WHERE id < 60 AND AI_FILTER(PROMPT('{QUESTION}', body))")
    assert {i for (i,) in sliced} == {i for i in exact if i < 60}
    with quail.RemoteSession(uri) as session:
        result = session.sql(f"SELECT id FROM notes WHERE AI_FILTER(PROMPT('{QUESTION}', body), {TARGETS}) "
                             "ORDER BY id").run()
    got = set(result.table.column("id").to_pylist())
    (stage,) = [s for s in result.report.stages if s["operator"] == "ai_cascade"]
    right = len(got & exact)
    recall, precision = right / len(exact), right / len(got)
    assert recall >= stage["recall_bound"] and precision >= stage["precision_bound"]
    assert abs(stage["recall_estimate"] - recall) <= 0.1 and abs(stage["precision_estimate"] - precision) <= 0.1
    assert stage["sample_rows"] + stage["asked"] + stage["accepted"] + stage["rejected"] == ROWS
    assert stage["accepted"] + stage["rejected"] > 0, "the proxy decided rows: the model was asked fewer"
    assert result.report.requests == stage["sample_rows"] + stage["asked"] < ROWS
    assert stage["auc"] > 0.9, "a word of the question is what an embedding learns"


def test_quail_queries_shows_a_running_cascades_figures(uri):
    """While a statement runs on past its cascade (here generating a reply for each row kept), quail_queries
    shows what the cascade decided: rows by the proxy and by the model, and its EXPLAIN ANALYZE line."""
    sql = (f"SELECT id, AI_COMPLETE(PROMPT('Reply to {{0}} at length.', body), {{'max_tokens': 256}}) FROM notes "
           f"WHERE AI_FILTER(PROMPT('Does {{0}} mention a puppy?', body), {TARGETS})")
    with quail.connect(uri) as conn, conn.cursor() as cur, conn.cursor() as watcher:
        failure: list = []

        def run() -> None:
            try:
                cur.execute(sql)
                cur.fetchall()
            except DriverError as err:
                failure.append(err)

        thread = threading.Thread(target=run)
        thread.start()
        for _ in range(240):
            watcher.execute("SELECT query, cascade_proxy_rows, cascade_model_rows, cascade FROM quail_queries")
            shown = next((row for row in watcher.fetchall() if row[0] == sql and row[1] is not None), None)
            if shown is not None or not thread.is_alive():
                break
            threading.Event().wait(0.25)
        cur.adbc_cancel()
        thread.join(60)
    assert shown is not None, "listed with its cascade's figures while it generates"
    _, by_proxy, by_model, line = shown
    assert by_proxy > 0 and by_proxy + by_model == ROWS
    assert line.startswith(f"{by_model:,} of {ROWS:,} rows asked of the model") and "recall estimated" in line
    assert not thread.is_alive() and failure, "cancelled while it generated"


def test_a_classification_cascade_keeps_its_accuracy(uri):
    """AI_CLASSIFY with an accuracy target: its categories against the exact query's (the rule's, checked on a
    slice) at least as accurate as the reported bound, fewer rows asked."""
    exact = [PET_LABELS[rule_category(PET_LABELS, [body])] for body in notes(ROWS, 1)["body"].to_pylist()]
    sliced = rows(uri, f"SELECT {pet('')} FROM notes WHERE id < 40 ORDER BY id")
    assert [label for (label,) in sliced] == exact[:40]
    with quail.RemoteSession(uri) as session:
        targeted = pet(", {'accuracy': 0.8, 'confidence': 0.8}")
        result = session.sql(f"SELECT id, {targeted} AS label FROM notes ORDER BY id").run()
    got = result.table.column("label").to_pylist()
    (stage,) = [s for s in result.report.stages if s["operator"] == "ai_cascade"]
    accuracy = sum(a == b for a, b in zip(got, exact)) / ROWS
    assert accuracy >= stage["accuracy_bound"] and abs(stage["accuracy_estimate"] - accuracy) <= 0.1
    assert stage["accepted"] > 0 and result.report.requests == stage["sample_rows"] + stage["asked"] < ROWS


def test_explain_analyze_says_what_the_cascade_did(uri):
    """A table smaller than the sample: every row labeled by the model, nothing left to the proxy."""
    plan = [line for (line,) in rows(uri, f"EXPLAIN ANALYZE SELECT id FROM few WHERE "
                                          f"AI_FILTER(PROMPT('{QUESTION}', body), {TARGETS})")]
    assert any("a cascade to recall 0.7 and precision 0.7 at confidence 0.7" in line for line in plan)
    (line,) = [line for line in plan if line.startswith("stage ai_cascade")]
    assert "40 of 40 rows asked of the model: a sample of 40" in line and "0 rejected" in line
    expected = [i for i, body in enumerate(notes(40, 2)["body"].to_pylist()) if rule_says_yes(QUESTION, [body])]
    assert [i for (i,) in rows(uri, f"SELECT id FROM few WHERE AI_FILTER(PROMPT('{QUESTION}', body), "
                                    f"{TARGETS}) ORDER BY id")] == expected


def test_a_later_cascade_reuses_what_an_earlier_one_learned_until_the_rows_change(uri):
    """The same question over the same rows: nothing asked again, other targets included; a changed table
    is asked afresh."""
    def run(targets: str) -> tuple[list, int, dict]:
        with quail.RemoteSession(uri) as session:
            result = session.sql(f"SELECT id FROM few WHERE AI_FILTER(PROMPT('Is {{0}} about a puppy?', body), "
                                 f"{targets}) ORDER BY id").run()
        (stage,) = [s for s in result.report.stages if s["operator"] == "ai_cascade"]
        return result.table.column("id").to_pylist(), result.report.requests, stage

    first, asked, _ = run(TARGETS)
    assert asked == 40
    again, asked, stage = run("{'recall': 0.9}")
    assert (again, asked, stage["remembered"]) == (first, 0, 40)
    rows(uri, "INSERT INTO few VALUES (40, 'The puppy slept by the bed.')")
    changed, asked, stage = run(TARGETS)
    assert (changed, asked, stage["remembered"]) == (first + [40], 41, 0)


@pytest.mark.parametrize("dialect, sql", [
    ("bigquery", "SELECT id FROM few WHERE AI.IF(('Does ', body, ' mention a kitten?'), STRUCT(0.9 AS recall))"),
    ("bigquery", "SELECT id FROM few WHERE AI.IF(('Does ', body, ' mention a kitten?'), {'recall': 0.9})"),
    ("duckdb", f"SELECT id FROM few WHERE AI_FILTER(PROMPT('{QUESTION}', body), {{'recall': 0.9}})"),
])
def test_every_dialect_states_targets(uri, dialect, sql):
    with quail.connect(uri, dialect=dialect) as conn, conn.cursor() as cur:
        cur.execute("EXPLAIN " + sql)
        plan = [line for (line,) in cur.fetchall()]
        assert any("a cascade to recall 0.9 (precision held to 0.9) at confidence 0.95" in line for line in plan)


@pytest.mark.parametrize("options, message", [
    ("{'recall': 1.5}", "recall must be a number in (0, 1]"),
    ("{'precision': 0}", "precision must be a number in (0, 1]"),
    ("{'recall': 0.9, 'confidence': 0}", "confidence must be a number in (0, 1)"),
    ("{'recall': 0.9, 'confidence': 1}", "confidence must be a number in (0, 1)"),
    ("{'confidence': 0.9}", "a cascade needs a recall, a precision or an accuracy target"),
    ("{'accuracy': 0.9}", "options must be"),
    ("{'recall': 0.9, 'speed': 2}", "options must be"),
])
def test_bad_targets_are_invalid_arguments(uri, options, message):
    with pytest.raises(DriverError, match="INVALID_ARGUMENT") as raised:
        rows(uri, f"SELECT id FROM few WHERE AI_FILTER(PROMPT('{QUESTION}', body), {options})")
    assert message in str(raised.value)


@pytest.mark.parametrize("sql, message", [
    (f"SELECT id, AI_FILTER(PROMPT('{QUESTION}', body), {{'recall': 0.9}}) AS k FROM few",
     "apply to AI_FILTER as a condition"),
    (f"SELECT id, AI_SCORE(PROMPT('{QUESTION}', body), {{'recall': 0.9}}) AS s FROM few",
     "targets are AI_FILTER's"),
    ("SELECT id, AI_CLASSIFY(body, ['a', 'b'], {'recall': 0.9}) AS c FROM few", "config must be"),
    ("SELECT id, AI_CLASSIFY(body, ['a', 'b'], {'accuracy': 1.5}) AS c FROM few", "accuracy must be a number"),
    (f"EXPLAIN (FORMAT SUBSTRAIT) SELECT id FROM few WHERE AI_FILTER(PROMPT('{QUESTION}', body), "
     f"{{'recall': 0.9}})", "a cascade's recall and precision targets are not supported"),
])
def test_targets_where_a_cascade_cannot_run_are_refused(uri, sql, message):
    with pytest.raises(DriverError) as raised:
        rows(uri, sql)
    assert message in str(raised.value)
