"""The host tier's choice, timed end to end when a runtime warms up: a pass's worth of new prompts copied back
from host memory (their last tokens computed) against the same prompts computed."""

import numpy as np

from quail.engine.model.config import EngineConfig
from quail.engine.runtime.loading import chosen, settled
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.requests import Request, Segment
from quail.engine.runtime.runtime import Runtime


def test_the_warm_up_times_copying_back_against_computing_and_the_tier_follows_its_choice(runtime):
    per_token = runtime.runner.pool.bytes_per_token
    small = Runtime(runtime.model_id, runtime.runner.model, runtime.tokenizer, runtime.layout.frame, "quail", 256,
                    kv_bytes=600 * per_token, kv_host_bytes=4000 * per_token)
    tree = small.runner.tree
    assert tree.host.restores, "untimed, the tier copies back"
    small.warm_up(full=False)
    host = tree.host
    assert tree.counts.offloaded >= 256 and tree.counts.restored >= 254, \
        "a pass of prompts (but their last tokens) copied back"
    assert host.restore_s > 0 and host.recompute_s > 0
    assert host.restores == (host.restore_s < host.recompute_s)
    choice = "copies back" if host.restores else "computes again"
    assert f"host KV tier {4000 * per_token / 2 ** 30:.1f} GiB ({choice}: " in chosen(settled(EngineConfig()), small)

    rng = np.random.default_rng(3)
    requests = [Request((Segment.of(rng.integers(100, 1000, 150), small.model_id),), small.yes_no) for _ in range(6)]
    first = small.score(requests, QueryWork())
    tree.evict(tree.pool.slots)
    for restore_s, copied in ((host.recompute_s / 2, True), (host.recompute_s * 2, False)):
        host.restore_s = restore_s
        restored, work = tree.counts.restored, QueryWork()
        again = small.score(requests, work)
        assert (tree.counts.restored > restored) == copied and (work.stats.fresh_tokens < 6 * 150) == copied
        np.testing.assert_allclose(again, first, atol=1e-4)
        tree.evict(tree.pool.slots)
