"""The host tier on a GPU: runs moved to pinned memory and back on the copy stream, read right after (GPU only)."""

from __future__ import annotations

import gc
import subprocess
import sys

import numpy as np
import pytest
import torch

from quail.engine.kv.host_tier import HostTier
from quail.engine.kv.pool import KVPool
from quail.engine.kv.resident import ResidentTree
from quail.engine.kv.runs import KV

if not torch.cuda.is_available():
    pytest.skip("the host tier's copy stream runs on CUDA", allow_module_level=True)

LAYERS, HEADS, D = 4, 8, 128


def _values(ids: np.ndarray, layer: int) -> torch.Tensor:
    """Keys that say which token and layer they belong to (exact in bf16 for small ids)."""
    base = torch.tensor(ids, dtype=torch.float32, device="cuda")[:, None, None]
    return (base + layer * 0.5).expand(-1, HEADS, D).to(torch.bfloat16)


def _run(pool: KVPool, ids: np.ndarray) -> KV:
    slots = pool.take(len(ids))
    kv = KV(((pool, slots),))
    at = torch.from_numpy(slots).cuda()
    for layer in range(LAYERS):
        pool.write(layer, at, _values(ids, layer), -_values(ids, layer))
    return kv


def test_runs_come_back_from_pinned_memory_exactly_and_in_order_with_the_passes():
    """Two hundred prompts through a pool of a quarter of them: every match, read at once after the copy
    back is queued (as a pass reads it), holds exactly the keys and values computed, in every layer."""
    pool = KVPool(LAYERS, HEADS, D, torch.bfloat16, torch.device("cuda"), 12_000)
    tree = ResidentTree(pool, HostTier(pool, 60_000))
    rng = np.random.default_rng(0)
    prompts = [np.concatenate([[1, 2, 3], rng.integers(10, 200, 200)]) for _ in range(200)]
    for ids in prompts:
        tree.insert(ids, _run(pool, ids))
        gc.collect()
    assert tree.counts.offloaded > 20_000 and tree.host_tokens > 20_000
    busy = torch.randn(4096, 4096, device="cuda")
    for ids in rng.permutation(len(prompts))[:100]:
        found = tree.match(prompts[ids])
        assert found.length == len(prompts[ids])
        tree.settle()
        for _ in range(3):
            busy = busy @ busy / 64  # work queued on the main stream beside the copy
        for layer in (0, LAYERS - 1):
            keys, values = found.kv.layer(layer)
            assert torch.equal(keys, _values(prompts[ids], layer)) and torch.equal(values, -keys)
    assert tree.counts.restored > 10_000
    torch.cuda.synchronize()


def test_runs_come_back_exactly_through_the_disk_tier_and_the_host_memory_is_pinned_as_it_fills(tmp_path):
    """A pool, a host tier and a disk tier of a fifth of the prompts each: prompts pushed through all three
    come back exactly from wherever they lie; the host tier pinned only the chunks runs went to."""
    pool = KVPool(LAYERS, HEADS, D, torch.bfloat16, torch.device("cuda"), 8_000)
    host = HostTier(pool, 8_000)
    tree = ResidentTree(pool, host, HostTier(pool, 8_000, tmp_path / "kv.bin"))
    assert not host._pinned.chunks, "nothing pinned before a run goes there"
    rng = np.random.default_rng(1)
    prompts = [np.concatenate([[1, 2, 3], rng.integers(10, 200, 200)]) for _ in range(120)]
    for ids in prompts:
        tree.insert(ids, _run(pool, ids))
        gc.collect()
    assert tree.counts.to_disk > 4_000 and tree.disk_tokens > 4_000 and host._pinned.chunks
    for i in rng.permutation(len(prompts))[:40]:
        found = tree.match(prompts[i])
        if found.length < len(prompts[i]):
            continue  # dropped from the disk tier for room
        tree.settle()
        for layer in (0, LAYERS - 1):
            keys, values = found.kv.layer(layer)
            assert torch.equal(keys, _values(prompts[i], layer)) and torch.equal(values, -keys)
    assert tree.counts.from_disk > 0 and tree.counts.restored > 0
    torch.cuda.synchronize()


def test_a_process_that_exits_while_its_host_tier_is_being_pinned_exits_cleanly():
    """A server stopped right after its start: the exit unpins the chunks pinned so far while the pinning
    thread is still at work (it had iterated a set the thread was adding to, and the process aborted)."""
    script = ("import torch; from quail.engine.kv.pool import KVPool; from quail.engine.kv.host_tier import HostTier\n"
              "pool = KVPool(4, 8, 128, torch.bfloat16, torch.device('cuda'), 1_000)\n"
              "tier = HostTier(pool, 400_000)\n")  # 6.5 GB: 25 chunks, pinned one after another
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "Error" not in done.stderr, done.stderr[-2000:]
