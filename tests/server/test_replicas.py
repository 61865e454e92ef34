"""A server with two runtime replicas (`--replicas 2`: its own and one in a process of its own, or a Ray
actor of a local Ray cluster), against a server with one: the same rows, scores and generated text; a
repeated query's documents go back to the replica holding them; a replica killed mid-query has its requests
run again, and restarts."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pytest

from quail.clients.server_process import ServerProcess, free_port, metric_samples

REVIEWS = pa.table({"id": list(range(8)),
                    "body": [f"Review {i}: the soup was {'cold' if i % 2 else 'hot'} and the staff "
                             f"{'rude' if i % 3 else 'kind'}; we paid {i % 40 + 10} euros." for i in range(8)]})
TOPICS = pa.table({"id": list(range(6)), "topic": ["food", "service", "price", "noise", "a film", "weather"]})
QUERIES = [
    "SELECT id, AI_SCORE(PROMPT('How positive is {0}?', body)) AS s FROM reviews ORDER BY id",
    "SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Does {0} complain about the staff?', body)) ORDER BY id",
    "SELECT id, AI_CLASSIFY(body, ['food', 'service', 'price']):labels[0]::string AS c FROM reviews ORDER BY id",
]
JOIN = ("SELECT r.id AS r, t.id AS t, AI_SCORE(PROMPT('How much is the review {0} about {1}?', r.body, t.topic)) AS s "
        "FROM reviews r CROSS JOIN topics t ORDER BY r.id, t.id")
SHORT_PASSES = ("--token-budget", "512")  # a join of many passes: a replica is killed in the middle of it


def _run(uri: str, query: str) -> pa.Table:
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(query)
        return cur.fetch_arrow_table()


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    with ServerProcess(tmp_path_factory.mktemp("one"), *SHORT_PASSES) as server:
        _load(server.uri)
        yield server.uri


@pytest.fixture(scope="module")
def alone(one):
    """A query's rows from the server of one runtime, asked once for both backends."""
    known: dict[str, pa.Table] = {}

    def rows(query: str) -> pa.Table:
        if query not in known:
            known[query] = _run(one, query)
        return known[query]

    return rows


BACKENDS = {"processes": (), "ray": ("--ray", "auto")}


@pytest.fixture(scope="module", params=list(BACKENDS))
def servers(request, alone, tmp_path_factory):
    """(one replica's rows of a query, two replicas, the latter's metrics URL, its replica's process id
    finder), over the same tables."""
    port = free_port()
    with ServerProcess(tmp_path_factory.mktemp("two"), *SHORT_PASSES, "--replicas", "2", "--metrics-port",
                       str(port), *BACKENDS[request.param], startup_timeout=600) as two:
        _load(two.uri)
        pids = _child_replicas(two.process.pid) if request.param == "processes" else _ray_actors
        yield alone, two.uri, f"http://127.0.0.1:{port}/metrics", pids


def _load(uri: str) -> None:
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.adbc_ingest("reviews", REVIEWS, mode="replace")
        cur.adbc_ingest("topics", TOPICS, mode="replace")


def _child_replicas(server_pid: int):
    """The server's replica processes: its children started by multiprocessing's spawn (not its resource
    tracker)."""
    def pids() -> list[int]:
        children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
        return [int(pid) for pid in children if b"spawn_main" in _cmdline(pid)]
    return pids


def _ray_actors() -> list[int]:
    """The processes of the replica actors (Ray names each after its actor class)."""
    return [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _cmdline(pid).startswith(b"ray::ReplicaWorker")]


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # it ended meanwhile
        return b""


def test_two_replicas_give_the_rows_and_scores_of_one(servers):
    one, two, metrics, _ = servers
    for query in QUERIES:
        single, replicated = one(query), _run(two, query)
        assert single.column_names == replicated.column_names
        if "s" in single.column_names:
            assert single["id"].equals(replicated["id"])
            assert max(abs(a - b) for a, b in zip(single["s"].to_pylist(), replicated["s"].to_pylist())) < 1e-4
        else:
            assert single.equals(replicated), query
    samples = metric_samples(metrics)
    assert samples["quail_replicas"] == 2 and samples["quail_replicas_up"] == 2
    for replica in ("0", "1"):  # the documents spread over both, and each one's device ran passes
        assert samples[f'quail_replica_tokens_total{{kind="logical",replica="{replica}"}}'] > 0
        assert samples[f'quail_replica_device_busy_seconds_total{{replica="{replica}"}}'] > 0


def test_a_repeated_query_finds_its_documents_on_the_replica_that_holds_them(servers):
    _, two, metrics, _ = servers
    query = "SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Was {0} written in the evening?', body)) ORDER BY id"

    def tokens() -> dict[str, float]:
        samples = metric_samples(metrics)
        return {f"{kind}{replica}": samples[f'quail_replica_tokens_total{{kind="{kind}",replica="{replica}"}}']
                for replica in "01" for kind in ("logical", "fresh", "cached")}

    before = tokens()
    first = _run(two, query)
    middle = tokens()
    assert _run(two, query).equals(first)
    after = tokens()
    for replica in "01":
        logical = after[f"logical{replica}"] - middle[f"logical{replica}"]
        assert logical > 0, "the documents spread over both replicas"
        assert logical == middle[f"logical{replica}"] - before[f"logical{replica}"], "each went where it went before"
        assert after[f"fresh{replica}"] - middle[f"fresh{replica}"] <= 0.1 * logical, "and was found resident there"


def test_explain_expects_the_documents_each_replica_holds(servers):
    """The planner counts a document resident when the replica it was routed to holds it: after the questions
    above, another question over the reviews expects nearly all their document tokens resident (half of
    them are on the other replica)."""
    _, two, _, _ = servers
    plan = _run(two, "EXPLAIN SELECT id FROM reviews WHERE AI_FILTER(PROMPT('Is {0} long?', body))")
    (line,) = [line for line in plan["plan"].to_pylist() if line.startswith("AI filter")]
    found = re.search(r"expects ~([\d,]+) of ([\d,]+) document tokens resident", line)
    resident, total = (int(found.group(k).replace(",", "")) for k in (1, 2))
    assert total > 0 and resident >= 0.9 * total, line


def test_completions_are_decoded_where_their_documents_go_and_give_one_runtimes_text(servers):
    """AI_COMPLETE with a response format: each row's prompt is continued on the replica its document is routed
    to (the JSON schema compiled there again), and the text is what one runtime gives."""
    one, two, metrics, _ = servers
    schema = ("{'type': 'object', 'properties': {'food': {'type': 'boolean'}}, 'required': ['food'], "
              "'additionalProperties': false}")
    query = (f"SELECT id, AI_COMPLETE(PROMPT('Is {{0}} about food? Answer in JSON.', body), {{'max_tokens': 24, "
             f"'response_format': {schema}}}) AS a FROM reviews ORDER BY id")

    def logical() -> list[float]:
        samples = metric_samples(metrics)
        return [samples[f'quail_replica_tokens_total{{kind="logical",replica="{r}"}}'] for r in "01"]

    before = logical()
    replicated = _run(two, query)
    assert replicated.equals(one(query))
    assert all(text.startswith('{"food":') for text in replicated["a"].to_pylist())
    assert all(after > then for after, then in zip(logical(), before)), "both replicas decoded some rows"


def test_a_replica_killed_mid_query_is_replaced_and_the_query_gets_its_rows(servers):
    one, two, metrics, replica_pids = servers
    expected = one(JOIN)
    [pid] = replica_pids()
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(_run(two, JOIN)))
    thread.start()
    deadline = time.monotonic() + 60
    while metric_samples(metrics)['quail_replica_queued_tokens{replica="1"}'] == 0:
        assert time.monotonic() < deadline, "the join never reached the second replica"
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    thread.join(300)
    assert outcome and outcome[0].select(["r", "t"]).equals(expected.select(["r", "t"]))
    assert max(abs(a - b) for a, b in zip(outcome[0]["s"].to_pylist(), expected["s"].to_pylist())) < 1e-4
    deadline = time.monotonic() + 120
    while metric_samples(metrics)["quail_replicas_up"] < 2:
        assert time.monotonic() < deadline, "the replica did not restart"
        time.sleep(0.2)
    samples = metric_samples(metrics)
    assert samples["quail_replica_restarts_total"] == 1
    assert samples["quail_replica_rerun_requests_total"] > 0, "it was killed with requests of the join"
    assert replica_pids() not in ([pid], [])
    assert _run(two, QUERIES[1]).equals(one(QUERIES[1])), "the restarted replica serves"
