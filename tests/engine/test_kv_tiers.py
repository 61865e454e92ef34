"""KV the pool has no room for moves down the tiers (host memory, then a disk directory) and comes back for a
later statement over the same rows: a dashboard's refresh after other work computes only its questions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

import quail
from quail.session import Report
from quail.engine.runtime.runtime import Runtime

SMALL_MODEL = True  # what these tests check holds for any model's arithmetic (tests/small_model.py)

WORDS = ("river", "market", "lantern", "harbor", "orchard", "engine", "violin", "glacier", "meadow", "copper",
         "signal", "canyon", "pepper", "thunder", "saddle", "marble")
DOCUMENTS = 8  # a table's rows
DOCUMENT_WORDS = 60  # about 70 tokens a document
QUERY = "SELECT id FROM {} WHERE AI_FILTER(PROMPT('Is this about the sea? {{0}}', body), {{'selectivity': 0.5}}) ORDER BY id"


def _table(seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": list(range(DOCUMENTS)),
                     "body": [" ".join(rng.choice(WORDS, DOCUMENT_WORDS)) + f" (note {seed}-{i})"
                              for i in range(DOCUMENTS)]})


def _session(runtime, pool_tokens: int, host_tokens: int, disk: tuple[Path, int] | None = None) -> quail.Session:
    """A session over the runtime's model with tiers of these many tokens (disk: a directory and tokens)."""
    per_token = runtime.runner.pool.bytes_per_token
    small = Runtime(runtime.model_id, runtime.runner.model, runtime.tokenizer, runtime.layout.frame, "quail", 256,
                    kv_bytes=pool_tokens * per_token, kv_host_bytes=host_tokens * per_token,
                    kv_disk=(disk[0], disk[1] * per_token) if disk else None)
    small.decisions = "hash"  # non-trivial row sets (half rejected: their documents demoted); passes still run
    session = quail.Session(runtime=small)
    session.register("first", _table(1))
    session.register("second", _table(2))
    return session


def _run(session: quail.Session, table: str) -> tuple[list[int], int]:
    rows, report = _report(session, table)
    return rows, report.fresh_tokens


def _report(session: quail.Session, table: str) -> tuple[list[int], Report]:
    result = session.sql(QUERY.format(table)).run()
    return result.collect().column("id").to_pylist(), result.report


@pytest.fixture(scope="module")
def roomy(runtime) -> tuple[list[int], list[int], int]:
    """The rows of the first table, of the second, and the fresh tokens of the first's refresh, in a pool that
    holds everything."""
    session = _session(runtime, 20_000, 0)
    first, _ = _run(session, "first")
    second, _ = _run(session, "second")
    again, questions = _run(session, "first")
    assert again == first and 0 < len(first) < DOCUMENTS, "some documents rejected"
    return first, second, questions


def test_a_refresh_after_other_work_copies_its_documents_back_from_host_memory(runtime, roomy):
    """A pool with room for one table's documents but not two, and host memory for both: after a query over
    the first table, one over the second, the first again computes only what a refresh in a pool holding
    everything computes (its questions), the documents its filter rejected included, with the same rows."""
    first_rows, second_rows, questions = roomy
    tiered = _session(runtime, 1_100, 4_000)
    tree = tiered.runtime.runner.tree
    assert _run(tiered, "first")[0] == first_rows
    assert _run(tiered, "second")[0] == second_rows
    assert tree.counts.offloaded > 0, "the first table's documents made room for the second's"
    texts = tiered.catalog.table("first").column("body")
    assert tiered.runtime.resident_share(texts) == 1.0, "untimed, a copy back counts as resident"
    tree.host.restore_s, tree.host.recompute_s = 1.0, 4.0  # copying back costs a quarter of computing
    assert 0.75 <= tiered.runtime.resident_share(texts) < 1.0, "the planner counts host tokens at their copy cost"
    tree.host.restore_s = tree.host.recompute_s = None
    rows, report = _report(tiered, "first")
    assert rows == first_rows
    assert report.fresh_tokens == questions, "every document came back from host memory, rejected ones too"
    assert report.host_restored_tokens == tree.counts.restored > 0 and report.disk_restored_tokens == 0



def test_the_same_through_a_disk_tier_when_host_memory_is_short(runtime, roomy, tmp_path):
    """A host tier of a few hundred tokens, and a disk tier behind it: the first table's documents go down to
    the disk and come back from there for the refresh, which computes only its questions."""
    first_rows, second_rows, questions = roomy
    tiered = _session(runtime, 1_100, 300, (tmp_path, 4_000))
    tree = tiered.runtime.runner.tree
    assert _run(tiered, "first")[0] == first_rows
    assert _run(tiered, "second")[0] == second_rows
    assert tree.counts.to_disk > 0 and list(tmp_path.iterdir()) == []
    rows, report = _report(tiered, "first")
    assert rows == first_rows and report.fresh_tokens == questions
    assert report.disk_restored_tokens == tree.counts.from_disk > 0
    _run(tiered, "second")
    analyzed = tiered.sql("EXPLAIN ANALYZE " + QUERY.format("first")).run().collect().column("plan").to_pylist()
    assert any("prompt tokens cached (" in line and "from disk" in line for line in analyzed), analyzed


def test_the_default_host_tier_fits_the_containers_memory_limit(tmp_path, monkeypatch):
    """Half of what the host has available, no more than its container's memory limit leaves (cgroup v2's
    `max` is no limit), shared by the host's replicas; none for a pool on the CPU."""
    from quail.engine.kv import host_tier

    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    limit.write_text(f"{4 << 30}\n")
    usage.write_text(f"{1 << 30}\n")
    monkeypatch.setattr(host_tier, "CGROUP_MEMORY", ((str(limit), str(usage)),))
    assert host_tier.available_host_bytes() <= 3 << 30
    assert host_tier.default_host_bytes(torch.device("cuda"), replicas=2) <= (3 << 30) // 4
    limit.write_text("max\n")
    assert host_tier.available_host_bytes() > 0
    assert host_tier.default_host_bytes(torch.device("cpu")) == 0
