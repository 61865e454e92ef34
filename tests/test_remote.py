"""One code path, two front doors: the same queries in-process, through RemoteSession and plain ADBC."""

from __future__ import annotations

import pyarrow as pa
import pytest

import quail

REVIEWS = pa.table({
    "id": [1, 2, 3, 4, 5],
    "body": ["The pasta was cold and the waiter was rude.", "Best tiramisu in town, lovely staff!",
             "Delivery was late and the box was crushed.", "Spotless room, quiet garden.", None],
    "stars": [1, 5, 1, 5, 3],
})
QUERIES = [
    ("snowflake", "SELECT id, stars FROM reviews WHERE stars > 1 ORDER BY id"),
    ("snowflake", "SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} a positive review?', body)) ORDER BY id"),
    ("snowflake", "SELECT AI_CLASSIFY(body, ['food', 'service', 'place']):labels[0]::string AS l, count(*) AS n "
                  "FROM reviews WHERE body IS NOT NULL GROUP BY l ORDER BY l"),
    ("bigquery", "SELECT `id`, AI.IF(('Is ', body, ' about food?')) AS food FROM reviews ORDER BY `id`"),
]


@pytest.fixture(scope="module")
def sessions(runtime, server):
    local = quail.Session(runtime=runtime)
    local.register("reviews", quail.DocumentProvider.from_table(REVIEWS, id_col="id"))
    with quail.RemoteSession(server.uri) as remote:
        assert isinstance(remote, quail.RemoteSession)
        remote.register("reviews", quail.DocumentProvider.from_table(REVIEWS, id_col="id"))
        yield local, remote


@pytest.mark.parametrize("dialect, sql", QUERIES, ids=["plain", "filter", "classify-group-by", "bigquery"])
def test_in_process_remote_and_adbc_agree(sessions, server, dialect, sql):
    local, remote = sessions
    ran_here = local.sql(sql, dialect=dialect).run()
    here, there = ran_here.collect(), remote.sql(sql, dialect=dialect).run()
    assert there.collect().to_pylist() == here.to_pylist()
    tokens = ["requests", "logical_tokens"]
    assert {k: getattr(there.report, k) for k in tokens} == {k: getattr(ran_here.report, k) for k in tokens}
    # The server keeps KV across queries (kv/resident.py): it may compute fewer tokens than a fresh runtime.
    assert there.report.fresh_tokens <= ran_here.report.fresh_tokens
    assert there.report.kv_regret_tokens <= ran_here.report.kv_regret_tokens
    assert there.report.wall_s > 0 and there.report.sol_s is not None
    with quail.connect(server.uri, dialect=dialect) as conn, conn.cursor() as cursor:
        cursor.execute(sql)
        assert cursor.fetch_arrow_table().to_pylist() == here.to_pylist()


def test_streams_and_explains_the_same(sessions):
    local, remote = sessions
    sql = "SELECT id FROM reviews WHERE AI_SCORE(PROMPT('Is {0} a positive review?', body)) >= 0 ORDER BY id"
    streamed = [row for batch in remote.sql(sql).execute_stream() for row in batch.to_pylist()]
    assert streamed == [row for batch in local.sql(sql).execute_stream() for row in batch.to_pylist()]
    assert streamed == [{"id": i} for i in (1, 2, 3, 4)]
    assert remote.sql(sql).explain() == local.sql(sql).explain().split("\n", 1)[1]


def test_seed_system_style_script_runs(capsys):
    """clients/api_example.py uses only the seed system's documented calls (EngineConfig(gpus, model, backend,
    device), Session, register(DocumentProvider.from_table(..., id_col)), sql, explain, run, collect, report)."""
    from quail.clients import api_example

    api_example.main()
    out = capsys.readouterr().out
    assert "AI filter (join layout" in out and "fresh and" in out and "KV regret" in out
