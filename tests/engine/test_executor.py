"""The executor's internals under SQL: filter chains re-ranked and pipelined, chunked plans, documents' KV kept."""

from __future__ import annotations

import pyarrow as pa

import quail
from quail.engine.ai.asking import Question, build_requests
from quail.engine.exec.executor import execute
from quail.engine.exec.plan import AIFilterChain
from tests.sample_tables import FILTER, JOIN, OPTS, REVIEWS

SMALL_MODEL = True  # what these tests check holds for any model's arithmetic (tests/small_model.py)


def test_filters_reranked_by_observed_selectivity_keep_the_rows(runtime):
    """A chain planned in the worse order is re-ranked after the first rows; the rows stay the same."""
    from dataclasses import replace

    from quail.engine.runtime.query_work import QueryWork

    session = quail.Session(runtime=runtime.variant("quail"))
    session.runtime.decisions = "hash"
    session.register("many", pa.table({"id": list(range(72)), "body": [f"Review {i} of a cafe." for i in range(72)]}))
    sql = ("SELECT id FROM many WHERE AI_FILTER(PROMPT('Is {0} long?', body), {'selectivity': 0.9}) "
           "AND AI_FILTER(PROMPT('Is {0} rude?', body), {'selectivity': 0.1}) ORDER BY id")
    plan = session.sql(sql).plan
    (chain,) = [s for s in plan.steps if isinstance(s, AIFilterChain)]
    assert [f.selectivity for f in chain.filters] == [0.1, 0.9], "ranked by the hints"
    worse = replace(plan, steps=tuple(replace(s, filters=s.filters[::-1]) if s is chain else s for s in plan.steps))
    work = QueryWork()
    got = execute(worse, session.catalog, session.runtime, work).column("id").to_pylist()
    assert got == [r["id"] for r in session.sql(sql).run().to_rows()] and got
    (rerank,) = [s for s in work.stages if s["operator"] == "ai_filter_rerank"]
    assert rerank["order"] == ["Is {0} rude?", "Is {0} long?"]


def test_chunked_plans_stream_the_rows_a_whole_run_gives(session, monkeypatch):
    """Chunks of two rows, then four: the same rows in the same order as one run over all rows, and
    each AI operator's stage counts every row once."""
    from quail.engine.exec import ai_step, executor
    from quail.engine.runtime.query_work import QueryWork

    monkeypatch.setattr(executor, "CHUNK_ROWS", (2, 4))
    sql = (f"SELECT id, upper(body) AS loud, AI_CLASSIFY(body, ['food', 'price', 'place']) AS topic FROM reviews "
           f"WHERE stars < 5 AND AI_FILTER(PROMPT('{FILTER}', body), {OPTS})")
    query = session.sql(sql)
    assert query.plan.chunked
    inputs, call = [], ai_step.call_of
    monkeypatch.setattr(ai_step, "call_of", lambda step, rows: (
        inputs.append((step.kind, rows.num_rows)), call(step, rows))[1])
    work = QueryWork()
    streamed = list(executor.execute_stream(query.plan, session.catalog, session.runtime, work))
    assert [n for kind, n in inputs if kind == "filter"] == [2, 4], "the filter ran over two chunks"
    whole = executor.execute(query.plan, session.catalog, session.runtime)
    assert pa.Table.from_batches(streamed, whole.schema).to_pylist() == whole.to_pylist()
    stages = {stage["operator"]: stage for stage in work.stages}
    assert stages["ai_filter"]["rows_in"] == sum(1 for s in REVIEWS["stars"].to_pylist() if s < 5)
    assert stages["ai_classify"]["rows_in"] == whole.num_rows


def test_a_streamed_filter_queues_each_chunk_before_reading_the_one_before(session, monkeypatch):
    """Chunks of 2, 4 and 2 rows through a filter: each chunk's answers are read only once the next chunk's
    passes are queued (the device need not wait for the host between chunks), and the rows are a whole run's."""
    import threading

    from quail.engine.exec import ai_step, executor

    monkeypatch.setattr(executor, "CHUNK_ROWS", (2, 4))
    query = session.sql(f"SELECT id, stars FROM reviews WHERE AI_FILTER(PROMPT('{FILTER}', body), {OPTS})")
    assert query.plan.chunked
    queued = [threading.Event() for _ in range(3)]
    asking, launches = ai_step.model_asking_together, iter(range(3))

    class Waiting:
        def __init__(self, *args):
            self.chunk, self.asking = next(launches), asking(*args)
            queued[self.chunk].set()

        def read(self):
            if self.chunk + 1 < len(queued):
                assert queued[self.chunk + 1].wait(60), f"chunk {self.chunk + 1} was not queued before reading"
            return self.asking.read()

    monkeypatch.setattr(ai_step, "model_asking_together", Waiting)
    streamed = list(executor.execute_stream(query.plan, session.catalog, session.runtime))
    assert all(event.is_set() for event in queued)
    monkeypatch.setattr(ai_step, "model_asking_together", asking)
    whole = executor.execute(query.plan, session.catalog, session.runtime)
    assert pa.Table.from_batches(streamed, whole.schema).to_pylist() == whole.to_pylist()


def test_a_chain_of_filters_reads_each_document_once(session, monkeypatch):
    """The second filter continues the documents the first one computed (the resident tree): without the
    tree it computes them again; with it, only its question (the few question tokens the two filters
    share are the regret left)."""
    first = f"SELECT id FROM reviews WHERE AI_FILTER(PROMPT('{FILTER}', body), {OPTS})"
    chain = first + " AND AI_FILTER(PROMPT('Does {0} mention the staff or the owner?', body), {'selectivity': 0.9})"
    cached = session.sql(chain).run()
    monkeypatch.setattr(session.runtime.runner, "tree", None)
    uncached = session.sql(chain).run()
    assert cached.collect() == uncached.collect()
    alone = session.sql(first).run().report
    second = cached.report.requests - alone.requests
    assert second > 0 and cached.report.fresh_tokens < uncached.report.fresh_tokens
    assert uncached.report.kv_regret_tokens > cached.report.kv_regret_tokens
    assert cached.report.kv_regret_tokens - alone.kv_regret_tokens <= 4 * second


def test_a_second_join_continues_the_anchors_the_first_kept(session, monkeypatch):
    """An AI join keeps each anchor one of whose partners passed as it was in the resident tree, and marks
    the others to go first when the pool needs room; a second join anchored on the same documents
    continues them instead of computing them again (the few question tokens its partners share are the
    regret left)."""
    tree = session.runtime.runner.tree
    first = (f"SELECT r.id AS r, a.id AS a FROM reviews r "
             f"JOIN aspects a ON AI_FILTER(PROMPT('{JOIN}', r.body, a.aspect), {OPTS})")
    both = first.replace("AS a FROM", "AS a, b.id AS b FROM") + (
        f" JOIN aspects b ON AI_FILTER(PROMPT('Is {{1}} praised in {{0}}?', r.body, b.aspect), {OPTS})")
    alone = session.sql(first).run().report
    cached = session.sql(both).run()
    kept = cached.collect()
    anchors = {i: r.tokens(0, r.prefix(2)[0]) for i, body in enumerate(REVIEWS["body"].to_pylist()) if body
               for r in build_requests(session.runtime, Question(JOIN, "join"), [[body, "the food"]])}
    passed = set(kept.column("r").to_pylist())
    assert 0 < len(passed) < len(anchors), "some anchors with a partner that passed, some without"
    assert all(tree.match(ids).length == len(ids) for ids in anchors.values()), "every anchor resident"
    tree.demote_noted()  # (done when the tree next changes)
    assert {i for i, ids in anchors.items() if not tree.match(ids).node.demoted} == passed
    monkeypatch.setattr(session.runtime.runner, "tree", None)
    assert session.sql(both).run().collect() == kept
    second = cached.report.requests - alone.requests
    assert second > 0 and cached.report.kv_regret_tokens - alone.kv_regret_tokens <= 4 * second


def test_a_chain_keeps_only_the_documents_still_in_play(session, monkeypatch):
    """With room in the pool for four documents, the chain runs in parts of two rows after its probe
    (two parts in flight), pipelined: each model call asks the first filter about a part and the second
    about the rows of the part before that passed the first, continuing their documents; the documents
    a filter rejected are the first to go when the pool needs room."""
    from quail.engine.exec import ai_chain, ai_step

    tree = session.runtime.runner.tree
    tree.clear()
    asked = build_requests(session.runtime, Question(FILTER), [[b] for b in REVIEWS["body"].to_pylist() if b])
    longest = max(r.prefix(2)[0] for r in asked)
    monkeypatch.setattr(tree.pool, "slots", 4 * longest + 1)
    monkeypatch.setattr(ai_chain, "PROBE_ROWS", 2)
    parts, calls, together = [], [], ai_step.asked_together
    def counted(steps, *args):  # the model calls of the run (not those of its result schema, over no rows)
        if any(rows.num_rows for _, rows in steps):
            parts.extend(rows.num_rows for _, rows in steps)
            calls.append(len(steps))
        return together(steps, *args)

    monkeypatch.setattr(ai_step, "asked_together", counted)
    monkeypatch.setattr(ai_chain, "asked_together", counted)
    chain = (f"SELECT id, body FROM reviews WHERE AI_FILTER(PROMPT('{FILTER}', body), {{'selectivity': 0.8}}) "
             f"AND AI_FILTER(PROMPT('Does {{0}} mention the staff or the owner?', body), {{'selectivity': 0.8}})")
    result = session.sql(chain).run()
    kept = result.collect()
    assert max(parts) <= 2 < REVIEWS.num_rows - 2, "after the probe, parts of the rows the cache holds"
    probe, pipelined = calls[:2], calls[2:]
    assert probe == [1, 1], "the probe asks each filter alone"
    assert pipelined == [1] + [2] * (len(pipelined) - 2) + [1] and len(pipelined) > 2, "both filters in one call"
    passed = set(kept.column("body").to_pylist())
    rejected = [r for r, b in zip(asked, [b for b in REVIEWS["body"].to_pylist() if b]) if b not in passed]
    held = [r for r, b in zip(asked, [b for b in REVIEWS["body"].to_pylist() if b]) if b in passed]
    tree.demote_noted()  # (done when the tree next changes)
    demoted = [tree.match(r.tokens(0, r.prefix(2)[0])).node.demoted for r in rejected + held]
    assert rejected and held and demoted == [True] * len(rejected) + [False] * len(held), "rejected go first"
    monkeypatch.setattr(session.runtime.runner, "tree", None)
    uncached = session.sql(chain).run()
    assert uncached.collect() == kept
    assert result.report.fresh_tokens < uncached.report.fresh_tokens
