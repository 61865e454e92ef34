"""The prefix-caching baseline's block cache: bounded by the KV pool, least recently used blocks give their slots back."""

from __future__ import annotations

import numpy as np
import torch

from quail.engine.ai.asking import Question, build_requests
from quail.engine.kv.pool import KVPool
from quail.engine.kv.runs import KV
from quail.engine.runtime.baselines import BlockPrefixCache, block_prefix, independent
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.model_runner import ModelRunner
from quail.engine.runtime.scheduler import PassScheduler

SMALL_MODEL = True  # what these tests check holds for any model's arithmetic (tests/small_model.py)


def test_make_room_drops_least_recently_used_blocks_no_row_holds():
    pool = KVPool(1, 1, 4, torch.float32, torch.device("cpu"), 64)
    cache = BlockPrefixCache()
    for key in (b"a", b"b", b"c", b"d"):  # stored oldest first: the pool is full
        cache.store(key, KV(((pool, pool.take(16)),)))
    assert pool.free == 0
    cache.make_room(pool, 32, held={b"a"})
    assert pool.free == 32 and len(cache) == 2, "two blocks went, the least recently used that no row holds"
    assert len(cache.lookup([b"a"], 1)) == 1 and len(cache.lookup([b"d"], 1)) == 1
    assert not cache.lookup([b"b"], 1) and not cache.lookup([b"c"], 1)
    cache.make_room(pool, 64, held={b"a", b"d"})
    assert pool.free == 32 and len(cache) == 2, "held blocks stay, however short the pool"


def test_block_cache_gives_its_slots_back_when_the_pool_needs_them(runtime, monkeypatch):
    """A pool of 256 slots, requests of about 2,000 tokens sharing a preamble: the cached blocks give their
    slots back as passes need them, so every pass writes into the shared pool (none into a pool of its
    own), the preamble's blocks are read by later passes, and the answers equal naive's."""
    dishes = ["soup", "staff", "room", "view", "bread", "music"]
    docs = [[f"Review {i}: the {dishes[i % 6]} was {'very ' * (i % 4)}good, and we would come back {i} times."]
            for i in range(24)]
    requests = build_requests(runtime, Question("Is {0} a positive review?"), docs)
    pool = KVPool.like(runtime.runner.pool, 256)
    private, like = [], KVPool.like
    monkeypatch.setattr(KVPool, "like", classmethod(lambda cls, of, slots: private.append(slots) or like(of, slots)))
    runner = ModelRunner(runtime.runner.model, token_budget=128, pool=pool)
    cache, stats = BlockPrefixCache(), Stats()
    scheduler = PassScheduler(runner)
    cached = block_prefix(scheduler, runner, requests, stats, cache)
    assert not private, "no pass fell back to a pool of its own"
    assert stats.kv_written > 4 * pool.slots, "the run wrote far more than the pool holds"
    assert stats.kv_read >= 16 * (len(requests) - 2), "later passes continued the preamble's cached blocks"
    assert 0 < len(cache) * cache.block_size <= pool.slots
    naive = independent(scheduler, runner, requests, Stats())
    logprobs = [runner.answer_logprobs(torch.stack(hidden), runtime.yes_no).numpy() for hidden in (cached, naive)]
    assert np.abs(logprobs[0] - logprobs[1]).max() <= 1e-4
