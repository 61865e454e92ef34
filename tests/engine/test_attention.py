"""Packed attention with resident runs (shared by reference, chained) against dense attention row by row."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from quail.engine.kernels.attention import attend, attention
from quail.engine.kernels.padding_buckets import padded_shape
from quail.engine.kernels.pass_rows import Rows
from quail.engine.kv.rows import copy_rows, gather_rows
from quail.engine.kv.runs import KV

H, HKV, D = 4, 2, 16


def _kv(n: int) -> KV:
    return KV.of([torch.randn(n, HKV, D)], [torch.randn(n, HKV, D)])


def _dense(q, k, v, past: KV | None, before: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """One row: causal over its own tokens after every key of its past (and of `before`, keys and values
    that follow the past), by SDPA with an explicit mask."""
    if before is not None:
        k, v = torch.cat([before[0], k]), torch.cat([before[1], v])
    if past is not None:
        pk, pv = past.layer(0)
        k, v = torch.cat([pk, k]), torch.cat([pv, v])
    n, m = q.shape[0], k.shape[0]
    mask = torch.ones(n, m, dtype=torch.bool).tril(m - n)
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                         attn_mask=mask, enable_gqa=True)
    return out[0].transpose(0, 1)


def test_rows_after_shared_and_chained_runs_match_dense_attention():
    torch.manual_seed(0)
    anchor = _kv(11)
    chained = anchor.then(_kv(6))  # a longer prefix that lists the anchor's slots instead of copying them
    assert len(chained) == 17 and chained.parts[0][0] is anchor.parts[0][0]
    lengths = [5, 9, 3, 7, 1, 4]
    pasts = [chained, chained, None, anchor, _kv(2), chained]
    q = torch.randn(sum(lengths), H, D)
    k, v = torch.randn(sum(lengths), HKV, D), torch.randn(sum(lengths), HKV, D)
    got = attention(q, k, v, Rows.build(lengths, pasts, torch.device("cpu")), 0)
    start = 0
    for n, past in zip(lengths, pasts):
        rows = slice(start, start + n)
        torch.testing.assert_close(got[rows], _dense(q[rows], k[rows], v[rows], past), atol=1e-5, rtol=1e-5)
        start += n


def test_attend_returns_the_log_sum_exp():
    torch.manual_seed(1)
    q, k, v = torch.randn(2, H, 6, D), torch.randn(2, HKV, 9, D), torch.randn(2, HKV, 9, D)
    out, lse = attend(q, k, v, causal=True)
    scores = q @ k.repeat_interleave(H // HKV, 1).transpose(-1, -2) / D ** 0.5
    scores = scores.masked_fill(~torch.ones(6, 9, dtype=torch.bool).tril(3), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1))
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v.repeat_interleave(H // HKV, 1))


def test_rows_of_very_different_lengths_are_padded_per_bucket():
    torch.manual_seed(2)
    lengths = [3, 300, 70, 5, 129, 64, 65]
    pasts = [_kv(4), None, None, _kv(7), None, None, None]
    rows = Rows.build(lengths, pasts, torch.device("cpu"))
    assert [(r, w) for _, r, w in rows.buckets] == [(3, 64), (2, 80), (1, 160), (1, 320)], "few shapes"
    assert rows.buckets[-1][0] + 300 < len(lengths) * 300, "no row is padded to the longest of the pass"
    q = torch.randn(sum(lengths), H, D)
    k, v = torch.randn(sum(lengths), HKV, D), torch.randn(sum(lengths), HKV, D)
    got = attention(q, k, v, rows, 0)
    start = 0
    for n, past in zip(lengths, pasts):
        span = slice(start, start + n)
        torch.testing.assert_close(got[span], _dense(q[span], k[span], v[span], past), atol=1e-5, rtol=1e-5)
        start += n


def test_bucket_shapes_are_few_and_close_to_exact():
    """cuDNN plans one kernel per shape: at most 8 row counts and 8 widths per octave, each ≤ 1/4 larger."""
    shapes = {(r, w): padded_shape(r, w) for r in range(1, 600) for w in range(65, 3000, 7)}
    for (r, w), (rows, width) in shapes.items():
        assert r <= rows <= r + r / 4 and w <= width <= w + w / 4, (r, w)
    for octave in range(7, 11):
        assert len({w for _, w in shapes.values() if 2 ** (octave - 1) < w <= 2 ** octave}) <= 8
        assert len({r for r, _ in shapes.values() if 2 ** (octave - 1) < r <= 2 ** octave}) <= 8
    assert padded_shape(12, 40) == (12, 40), "short rows (two matmuls) are not padded"


def test_unpadded_rows_copy_short_runs_before_their_rows_and_attend_long_ones_apart():
    """The varlen layout (flash on the GPU; bench/gpu_check.py checks the kernel): a run no longer than its
    rows' own tokens is copied before each row, so each row's keys are [run, own]; longer runs stay apart."""
    torch.manual_seed(3)
    preamble, anchor = _kv(5), _kv(40)
    lengths = [9, 12, 3, 4, 6]
    pasts = [preamble, preamble, anchor, anchor, None]
    rows = Rows.build(lengths, pasts, torch.device("cpu"), padded=False)
    assert rows.buckets == [] and [(a, e, len(kv)) for a, e, kv in rows.runs] == [(21, 28, 40)]
    packed = rows.packed
    assert packed.offsets.tolist() == [0, 9, 21, 24, 28, 34] and packed.longest == 12
    assert packed.key_offsets.tolist() == [0, 14, 31, 34, 38, 44] and packed.longest_keys == 17
    k, v = torch.randn(sum(lengths), HKV, D), torch.randn(sum(lengths), HKV, D)
    keys, values = packed.keys(k, v, 0)
    pk, pv = preamble.layer(0)
    starts, key_starts = packed.offsets.tolist(), packed.key_offsets.tolist()
    for b, past in enumerate(pasts):
        own = slice(starts[b], starts[b + 1])
        want_k = torch.cat([pk, k[own]]) if past is preamble else k[own]
        want_v = torch.cat([pv, v[own]]) if past is preamble else v[own]
        assert torch.equal(keys[key_starts[b] : key_starts[b + 1]], want_k)
        assert torch.equal(values[key_starts[b] : key_starts[b + 1]], want_v)
    plain = Rows.build(lengths, [None] * 5, torch.device("cpu"), padded=False).packed
    assert plain.own_index is None and plain.keys(k, v, 0)[0] is k, "no copies without a short run"


def _tree_pass():
    """A pass whose rows continue earlier rows of it: a root, two children, a grandchild, and a row
    after a resident anchor with a child of its own. Returns lengths, pasts, parents, and each row's
    chain (the packed tokens of the rows it continues)."""
    anchor = _kv(30)
    lengths = [6, 9, 12, 10, 4, 11]
    pasts = [None, None, None, None, anchor, anchor]
    parents = [None, 0, 0, 1, None, 4]
    starts = [0, 6, 15, 27, 37, 41]
    spans = [list(range(a, a + n)) for a, n in zip(starts, lengths)]
    chains = [[], spans[0], spans[0], spans[0] + spans[1], [], spans[4]]
    return lengths, pasts, parents, chains


def test_rows_continuing_earlier_rows_of_their_pass_match_dense_attention():
    """The radix plan runs a short prefix and its children in one pass: each child attends to its
    ancestors' keys of this pass (and to the resident KV they continue), causally to its own."""
    torch.manual_seed(4)
    lengths, pasts, parents, chains = _tree_pass()
    rows = Rows.build(lengths, pasts, torch.device("cpu"), parents=parents)
    assert rows.context == [0, 6, 6, 15, 30, 34]
    q = torch.randn(sum(lengths), H, D)
    k, v = torch.randn(sum(lengths), HKV, D), torch.randn(sum(lengths), HKV, D)
    got = attention(q, k, v, rows, 0)
    start = 0
    for n, past, chain in zip(lengths, pasts, chains):
        span = slice(start, start + n)
        want = _dense(q[span], k[span], v[span], past, (k[chain], v[chain]))
        torch.testing.assert_close(got[span], want, atol=1e-5, rtol=1e-5)
        start += n


def test_unpadded_rows_copy_their_chain_after_their_copied_run():
    """Varlen: a row's keys are [copied run, chain, own]; a long run stays apart, its rows' chains copied."""
    torch.manual_seed(5)
    lengths, pasts, parents, chains = _tree_pass()
    rows = Rows.build(lengths, pasts, torch.device("cpu"), padded=False, parents=parents)
    assert [(a, e, len(run)) for a, e, run in rows.runs] == [(37, 52, 30)], "the anchor is attended apart"
    k, v = torch.randn(sum(lengths), HKV, D), torch.randn(sum(lengths), HKV, D)
    keys, values = rows.packed.keys(k, v, 0)
    starts, key_starts = rows.packed.offsets.tolist(), rows.packed.key_offsets.tolist()
    for b, chain in enumerate(chains):
        own = list(range(starts[b], starts[b + 1]))
        assert torch.equal(keys[key_starts[b] : key_starts[b + 1]], k[chain + own])
        assert torch.equal(values[key_starts[b] : key_starts[b + 1]], v[chain + own])
    with pytest.raises(ValueError, match="earlier row"):
        Rows.build([3, 3], [None, None], torch.device("cpu"), parents=[1, None])


def test_unpadded_rows_written_to_the_pool_read_their_keys_in_one_gather():
    """Where the pass writes its tokens' KV into the pool holding the copied runs before attention, each
    row's keys [copied run, chain, own] are gathered from that pool by slot, in every layer equal to the
    copies made from the runs and the pass's own keys; a copied run in another pool keeps the copies."""
    from quail.engine.kv.pool import KVPool

    torch.manual_seed(6)
    pool = KVPool(2, HKV, D, torch.float32, torch.device("cpu"), 256)
    preamble_slots, anchor_slots = pool.take(5), pool.take(30)
    for layer in range(2):
        for slots in (preamble_slots, anchor_slots):
            pool.write(layer, torch.from_numpy(slots), torch.randn(len(slots), HKV, D), torch.randn(len(slots), HKV, D))
    preamble, anchor = KV(((pool, preamble_slots),)), KV(((pool, anchor_slots),))
    lengths = [6, 9, 12, 10, 4, 11, 7, 8]
    parents = [None, 0, 0, 1, None, 4, None, None]
    written = pool.take(sum(lengths))
    own = [(torch.randn(sum(lengths), HKV, D), torch.randn(sum(lengths), HKV, D)) for _ in range(2)]
    for layer, (k, v) in enumerate(own):
        pool.write(layer, torch.from_numpy(written), k, v)
    elsewhere = KV.of([torch.randn(5, HKV, D) for _ in range(2)], [torch.randn(5, HKV, D) for _ in range(2)])
    for pasts, gathered in (([preamble] * 4 + [anchor] * 2 + [None, preamble], True),
                            ([preamble] * 4 + [anchor] * 2 + [None, elsewhere], False)):
        copies = Rows.build(lengths, pasts, torch.device("cpu"), padded=False, parents=parents).packed
        rows = Rows.build(lengths, pasts, torch.device("cpu"), padded=False, parents=parents,
                          written=(pool, written))
        assert [(a, e, len(run)) for a, e, run in rows.runs] == [(37, 52, 30)], "the anchor is attended apart"
        assert (rows.packed.key_slots is not None) == gathered and (rows.packed.own_index is None) == gathered
        assert rows.packed.key_offsets.tolist() == copies.key_offsets.tolist()
        for layer, (k, v) in enumerate(own):
            for got, want in zip(rows.packed.keys(k, v, layer), copies.keys(k, v, layer)):
                assert torch.equal(got, want)


def test_one_token_rows_after_their_own_pooled_runs_match_dense_attention():
    """Decode steps: one-token rows, each after its own run in the pool (runs of different lengths, slots
    scattered), attended together as padded matmuls; against dense attention row by row, in each layer."""
    from quail.engine.kv.pool import KVPool

    torch.manual_seed(4)
    pool = KVPool(2, HKV, D, torch.float32, torch.device("cpu"), 512)
    slots = pool.take(400)
    for layer in range(2):
        pool.write(layer, torch.from_numpy(slots[::-1].copy()), torch.randn(400, HKV, D), torch.randn(400, HKV, D))
    whole = KV(((pool, slots[::-1].copy()),))
    pasts = [whole.slice(a, b) for a, b in ((0, 37), (40, 41), (50, 250), (260, 262), (300, 399))]
    lengths = [1] * len(pasts)
    q = torch.randn(len(pasts), H, D)
    k, v = torch.randn(len(pasts), HKV, D), torch.randn(len(pasts), HKV, D)
    layout = Rows.build(lengths, pasts, torch.device("cpu"))
    assert layout.run_slots is not None and len(layout.runs) == len(pasts)
    for layer in range(2):
        got = attention(q, k, v, layout, layer)
        for row, past in enumerate(pasts):
            in_layer = KV.of(*([t] for t in past.layer(layer)))
            want = _dense(q[row:row + 1], k[row:row + 1], v[row:row + 1], in_layer)
            torch.testing.assert_close(got[row:row + 1], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype,shape", [(torch.bfloat16, (8, 3, 64)), (torch.float32, (8, 3, 64)),
                                         (torch.bfloat16, (8, 3)), (torch.float16, (8, 1, 5))])
def test_rows_copied_and_gathered_as_words_equal_index_copy_and_select(dtype, shape):
    """copy_rows gives index_copy_'s bits and gather_rows index_select's: rows of whole words (bf16 3×64, fp32
    3×64) as int64, rows of 6 or 10 bytes element by element; into (from) a buffer's slice too (its offset a
    whole number of words or not); no rows."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(5, *shape[1:], generator=gen).to(dtype)
    index = torch.tensor([6, 0, 3, 7, 1])
    base = torch.randn(*shape, generator=gen).to(dtype)
    assert torch.equal(copy_rows(base.clone(), index, rows), base.clone().index_copy_(0, index, rows))
    assert torch.equal(copy_rows(base.clone(), index[:0], rows[:0]), base)
    for start in (1, 2):
        buffer, expected = base.repeat(2, *[1] * (len(shape) - 1)), base.repeat(2, *[1] * (len(shape) - 1))
        copy_rows(buffer[start:start + 8], index, rows)
        expected[start:start + 8].index_copy_(0, index, rows)
        assert torch.equal(buffer, expected)
    transposed = base.clone().transpose(0, -1)  # not contiguous: element by element
    assert torch.equal(copy_rows(transposed.clone(), torch.tensor([0]), transposed[1:2].clone()),
                       transposed.clone().index_copy_(0, torch.tensor([0]), transposed[1:2].clone()))
    for source in (base, base.repeat(2, *[1] * (len(shape) - 1))[1:9], base.transpose(0, -1)):
        for picked in (index, index[:0]):
            picked = picked[picked < source.shape[0]]
            assert torch.equal(gather_rows(source, picked), source.index_select(0, picked)), "gathered alike"

