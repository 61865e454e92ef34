"""The KV pool's slots held by runs, and the resident tree over them: longest prefixes, no copies, eviction order
(demoted first, then by value), the host and disk tiers."""

from __future__ import annotations

import gc

import numpy as np
import torch

from quail.engine.kv.host_tier import HostTier
from quail.engine.kv.pool import KVPool
from quail.engine.kv.resident import ResidentTree
from quail.engine.kv.runs import KV

LAYERS, HEADS, D = 2, 2, 4


def _pool(slots: int) -> KVPool:
    return KVPool(LAYERS, HEADS, D, torch.float32, torch.device("cpu"), slots)


def _run(pool: KVPool, ids: np.ndarray) -> KV:
    """A run of `ids` whose keys are the token ids themselves (so a gather shows which tokens it read)."""
    slots = pool.take(len(ids))
    assert slots is not None
    kv = KV(((pool, slots),))
    values = torch.from_numpy(np.asarray(ids, dtype=np.float32))[:, None, None].expand(-1, HEADS, D)
    for layer in range(LAYERS):
        pool.write(layer, torch.from_numpy(slots), values, -values)
    return kv


def _tokens(kv: KV) -> list[int]:
    return kv.layer(1)[0][:, 0, 0].int().tolist()


def test_runs_share_slots_and_free_them_with_the_last_holder():
    pool = _pool(10)
    first = _run(pool, np.arange(4))
    longer = first.then(_run(pool, np.arange(10, 13)))
    assert _tokens(longer) == [0, 1, 2, 3, 10, 11, 12] and pool.used == 7
    middle = longer.slice(2, 5)
    assert _tokens(middle) == [2, 3, 10]
    del first, longer
    gc.collect()
    assert pool.used == 3, "only the slice's slots are still held"
    del middle
    gc.collect()
    assert pool.used == 0 and pool.take(10) is not None


def test_a_run_cut_into_blocks_holds_each_blocks_slots_until_that_block_goes():
    pool = _pool(10)
    run = _run(pool, np.arange(7))
    blocks = run.blocks(3)
    assert [_tokens(b) for b in blocks] == [[0, 1, 2], [3, 4, 5], [6]]
    del run
    gc.collect()
    assert pool.used == 7
    del blocks[1]
    gc.collect()
    assert pool.used == 4 and sorted(pool.take(6)) == [3, 4, 5, 7, 8, 9]


def test_the_tree_finds_the_longest_prefix_whoever_computed_it_and_copies_nothing():
    pool = _pool(64)
    tree = ResidentTree(pool)
    a = np.array([1, 2, 3, 4, 5, 6])
    b = np.array([1, 2, 3, 7, 8])
    tree.insert(a, _run(pool, a))
    computed = _run(pool, b)
    tree.insert(b, computed)  # splits a's edge after [1, 2, 3]
    assert pool.used == 11 and tree.tokens == 8, "the tree holds b's last two tokens by reference"
    del computed
    gc.collect()
    assert pool.used == 8, "b's own KV of the shared tokens is freed: the tree holds a's"
    found = tree.match(np.array([1, 2, 3, 7, 9]))
    assert found.length == 4 and _tokens(found.kv) == [1, 2, 3, 7]
    whole = tree.match(a, limit=len(a) - 1)
    assert whole.length == 5 and _tokens(whole.kv) == [1, 2, 3, 4, 5], "a request computes its last token"
    assert tree.match(np.array([9, 1])).length == 0 and tree.match(np.array([9, 1])).kv is None
    assert tree.counts.hit == 9 and tree.counts.looked_up == 5 + 5 + 2 + 2
    planned = tree.match(np.array([1, 2, 3, 7, 9]), counted=False, pin=True, with_kv=False)
    assert (planned.length, planned.node, planned.kv) == (4, found.node, None), "a plan's match holds no KV"
    tree.unpin(planned.node)


def test_leaves_go_demoted_first_then_least_valuable_never_pinned_ones():
    pool = _pool(12)
    tree = ResidentTree(pool)
    prompts = [np.array([1, 2, n, n]) for n in (10, 20, 30, 40)]  # [1, 2] shared, four leaves of 2
    for ids in prompts:
        tree.insert(ids, _run(pool, ids))
    gc.collect()
    assert pool.used == 10
    tree.match(prompts[0])  # used most recently after the last inserted
    tree.demote(prompts[3], after=2)
    pinned = tree.match(prompts[1]).node
    tree.pin(pinned)
    assert pool.take(6) is not None  # 2 free: evicts 2 leaves, the demoted one first, then prompts[2]
    assert tree.match(prompts[3]).length == 2 and tree.match(prompts[2]).length == 2
    assert tree.match(prompts[0]).length == 4 and tree.match(prompts[1]).length == 4
    assert tree.counts.evicted == 4
    tree.clear()
    assert tree.match(prompts[1]).length == 4, "a pinned prefix stays through clear"
    tree.unpin(pinned)
    tree.clear()
    gc.collect()
    assert tree.tokens == 0 and tree.match(prompts[1]).length == 0


def test_a_leaf_a_query_still_holds_frees_nothing_so_the_next_goes_too():
    """Leaves taken out of the tree count as freed only once the pool has them back: when a query still holds
    the first one's slots, eviction goes on to the next leaf."""
    pool = _pool(8)
    tree = ResidentTree(pool)
    prompts = [np.array([n, n]) for n in (10, 20, 30, 40)]  # four leaves of 2, least recently used first
    held = [_run(pool, ids) for ids in prompts]
    for ids, kv in zip(prompts, held):
        tree.insert(ids, kv)
    still_held = held[0]  # a running query's hold on the oldest leaf's slots
    del held
    gc.collect()
    assert pool.free == 0
    assert pool.take(2) is not None
    assert [tree.match(ids).length for ids in prompts] == [0, 0, 2, 2]
    assert tree.counts.evicted == 4 and _tokens(still_held) == [10, 10]


def test_a_pass_keeps_its_kv_in_a_pool_of_its_own_when_the_pool_is_held_by_running_queries():
    pool = _pool(4)
    held = _run(pool, np.arange(4))
    slots = pool.take(3)
    assert slots is None and pool.free == 0
    own = KVPool.like(pool, 3)
    extra = _run(own, np.arange(20, 23))
    assert _tokens(held.then(extra)) == [0, 1, 2, 3, 20, 21, 22]


def test_kv_kept_in_a_pool_of_its_own_is_not_indexed():
    """The tree indexes runs of its pool only: a pass's KV in a pool of its own (the pool was full) would be read
    from the pool's slots of the same numbers when it moved to the host tier (another prompt's KV, returned as
    this one's when it came back)."""
    pool = _pool(4)
    tree = ResidentTree(pool, HostTier(pool, 8))
    first = np.array([1, 2, 3, 4])
    tree.insert(first, _run(pool, first))
    own = KVPool.like(pool, 3)
    tree.insert(np.array([1, 2, 3, 4, 5, 6, 7]), _run(own, np.array([5, 6, 7])), start=4,
                before=tree.match(first).kv)
    assert tree.match(np.array([1, 2, 3, 4, 5, 6, 7])).length == 4, "the pass's own pool is not indexed"
    tree.insert(np.array([8, 9]), _run(own, np.array([8, 9])))
    assert tree.match(np.array([8, 9])).length == 0 and (tree.tokens, tree.nodes) == (4, 1)
    tree.evict(4)
    found = tree.match(first)
    tree.settle()
    assert _tokens(found.kv) == [1, 2, 3, 4], "what comes back from the host tier is what was computed"


def test_leaves_the_pool_has_no_room_for_go_to_the_host_tier_and_come_back_exactly():
    pool = _pool(10)
    tree = ResidentTree(pool, HostTier(pool, 6))
    prompts = [np.array([1, 2, n, n + 1]) for n in (10, 20, 30)]  # [1, 2] shared, leaves of 2
    for ids in prompts[:2]:
        tree.insert(ids, _run(pool, ids))
    gc.collect()
    tree.insert(prompts[2], _run(pool, prompts[2]))  # 4 slots wanted, 4 free: nothing moves
    gc.collect()
    assert (tree.tokens, tree.host_tokens) == (8, 0)
    tree.evict(3)  # the two least recently used leaves go to the host
    assert (tree.tokens, tree.host_tokens, tree.counts.offloaded) == (4, 4, 4) and pool.free == 6
    found = tree.match(prompts[0], limit=3)  # half of a leaf in the host tier: that half comes back
    tree.settle()
    assert found.length == 3 and _tokens(found.kv) == [1, 2, 10], "the copy back is the computed KV"
    assert found.kv.layer(0)[1][:, 0, 0].int().tolist() == [-1, -2, -10], "values too"
    assert tree.counts.restored == 1 and tree.host_tokens == 3
    assert tree.match(prompts[1]).length == 4 and tree.host_tokens == 1
    again = _run(pool, prompts[0][2:])
    tree.insert(prompts[0], again, start=2, before=tree.match(prompts[0], limit=2).kv)
    assert tree.host_tokens == 0 and tree.counts.restored == 3, "computed again: the host's copy is let go"
    del found, again
    tree.clear()
    gc.collect()
    assert (tree.tokens, tree.host_tokens, pool.used, tree.host.used) == (0, 0, 0, 0)


def test_a_demotion_noted_for_later_is_done_before_the_tree_changes_or_leaves_go():
    """demote_later changes nothing until the next insert or eviction, which do it first (on the nodes as they
    were: a prompt inserted below a demoted document afterwards is not demoted); past NOTED_MAX prompts
    noted, at once."""
    from quail.engine.kv import resident

    pool = _pool(12)
    tree = ResidentTree(pool)
    prompts = [np.array([1, 2, n, n]) for n in (10, 20, 30)]
    for ids in prompts:
        tree.insert(ids, _run(pool, ids))
    asked = []
    tree.demote_later(lambda: asked.append(1) or [(prompts[2][:3], 2)], 1)
    assert not asked and not tree.match(prompts[2]).node.demoted, "nothing done yet"
    later = np.array([1, 2, 30, 31])
    tree.insert(later, _run(pool, later))  # demotes prompts[2]'s document first, then goes below it
    assert asked == [1] and tree.match(prompts[2]).node.demoted and not tree.match(later).node.demoted
    tree.demote_later(lambda: [(prompts[0], 2)], 1)
    gc.collect()
    assert pool.take(4) is not None, "1 slot short: one leaf goes"
    assert tree.match(prompts[0]).length == 2, "prompts[0]'s, demoted by then (else prompts[2]'s would go)"
    assert tree.match(prompts[1]).length == 4 and tree.match(prompts[2]).length == 4
    noted = []
    tree.demote_later(lambda: noted.append(1) or [], resident.NOTED_MAX - 1)
    tree.demote_later(lambda: noted.append(2) or [], 1)
    assert noted == [], "NOTED_MAX prompts may wait"
    tree.demote_later(lambda: noted.append(3) or [], 1)
    assert noted == [1, 2, 3], "past NOTED_MAX prompts, every noted one done at once"


def test_the_host_tier_takes_demoted_leaves_too_and_drops_its_least_valuable():
    """A demoted leaf leaves the pool first, for the host tier (a later statement may read it again); a full
    host tier makes room by dropping leaves worth less than those coming in."""
    pool = _pool(6)
    tree = ResidentTree(pool, HostTier(pool, 4))
    prompts = [np.array([n, n + 1]) for n in (10, 20, 30, 40, 50)]
    for ids in prompts[:3]:
        tree.insert(ids, _run(pool, ids))
        gc.collect()
    tree.match(prompts[0])
    tree.match(prompts[0])  # three uses: worth the most
    tree.demote(prompts[2], after=0)
    for ids in prompts[3:]:
        tree.insert(ids, _run(pool, ids))  # room made: the demoted leaf first, then the least valuable
        gc.collect()
    assert (tree.counts.evicted, tree.counts.offloaded) == (0, 4)
    assert tree.resident_length(prompts[2]) == tree.resident_length(prompts[1]) == 2
    tree.evict(4)  # two more leaves, worth more than the host's two: those make room
    assert tree.resident_length(prompts[1]) == tree.resident_length(prompts[2]) == 0
    assert tree.resident_length(prompts[3]) == tree.resident_length(prompts[4]) == 2
    assert (tree.tokens, tree.host_tokens, tree.counts.evicted, tree.host.used) == (2, 4, 4, 4)
    assert tree.match(prompts[0]).length == 2, "the most used stays in the pool"


def test_a_prefix_several_statements_read_outlives_a_one_off_scan():
    """A document three statements read stays through a scan of one-off documents passing through the pool
    (least recently used would have let it go at the scan's fourth document), and then ages out."""
    pool = _pool(8)
    tree = ResidentTree(pool)
    shared = np.array([1, 2])
    tree.insert(shared, _run(pool, shared))
    gc.collect()
    tree.match(shared)
    tree.match(shared)
    scan = [np.array([n, n + 1]) for n in range(10, 30, 2)]
    for ids in scan[:6]:
        tree.insert(ids, _run(pool, ids))
        gc.collect()
    assert tree.resident_length(shared) == 2
    assert [tree.resident_length(ids) for ids in scan[:6]] == [0, 0, 0, 2, 2, 2]
    for ids in scan[6:]:
        tree.insert(ids, _run(pool, ids))
        gc.collect()
    assert tree.resident_length(shared) == 0, "unused since, it ages out"


def test_leaves_the_host_tier_has_no_room_for_go_to_the_disk_tier_and_come_back_exactly(tmp_path):
    """Pool, host tier and disk tier of 4 tokens each: leaves pushed out of the pool move to the host tier,
    and from there to a file on the disk; a match copies one back from the disk into the pool, its keys and
    values as computed; the file is gone from the directory from the start."""
    pool = _pool(4)
    tree = ResidentTree(pool, HostTier(pool, 4), HostTier(pool, 4, tmp_path / "kv.bin"))
    assert list(tmp_path.iterdir()) == [], "the disk tier's file is unlinked at once"
    prompts = [np.array([n, n + 1]) for n in (10, 20, 30, 40, 50, 60)]
    for ids in prompts:
        tree.insert(ids, _run(pool, ids))
        gc.collect()
    assert (tree.tokens, tree.host_tokens, tree.disk_tokens) == (4, 4, 4)
    assert tree.counts.to_disk == 4 and tree.counts.evicted == 0
    assert [tree.resident_length(ids) for ids in prompts] == [2] * 6
    found = tree.match(prompts[0])  # on the disk: copied back into the pool
    tree.settle()
    assert found.length == 2 and _tokens(found.kv) == [10, 11] and tree.counts.from_disk == 2
    del found
    gc.collect()
    assert tree.disk_tokens + tree.host_tokens + tree.tokens + tree.counts.evicted == 12
    assert tree.disk.used == tree.disk_tokens and tree.host.used == tree.host_tokens
    tree.clear()
    gc.collect()
    assert (tree.tokens, tree.host_tokens, tree.disk_tokens, tree.host.used, tree.disk.used) == (0, 0, 0, 0, 0)


def test_host_extents_are_split_and_merged_back():
    pool = _pool(4)
    host = HostTier(pool, 10)
    runs = [host.take(n) for n in (3, 3, 3)]
    host.free(runs[1])
    spread = host.take(4)  # 3 in the gap and 1 at the end
    assert spread.extents == [(3, 3), (9, 1)] and host.used == 10
    head, tail = spread.split(2)
    assert head.extents == [(3, 2)] and tail.extents == [(5, 1), (9, 1)]
    for run in (head, tail, runs[0], runs[2]):
        host.free(run)
    assert host.used == 0 and host.take(10).extents == [(0, 10)]


def test_a_prefix_planned_on_comes_back_whole_where_the_host_tier_would_rather_compute_it_again():
    """A job plans on a resident prefix (pinned, nothing held) that then moves to a host tier which computes
    again rather than copy back: a new match stops before it, but the job's match (promised) copies it back,
    all of its tokens (a shorter run, taken as the whole prefix, would shift every position after it)."""
    pool = _pool(8)
    tree = ResidentTree(pool, HostTier(pool, 8))
    tree.host.restore_s, tree.host.recompute_s = 2.0, 1.0
    ids = np.array([1, 2, 3, 4, 5, 6])
    tree.insert(ids, _run(pool, ids))
    gc.collect()
    planned = tree.match(ids, fetch=False, pin=True, with_kv=False)
    tree.evict(8)
    assert planned.length == 6 and tree.host_tokens == 6 and tree.match(ids).length == 0
    found = tree.match(ids, promised=True)
    tree.settle()
    assert found.length == 6 and _tokens(found.kv) == [1, 2, 3, 4, 5, 6]
    tree.unpin(planned.node)
