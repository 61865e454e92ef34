"""Decode steps: one token per sequence after its KV in the pool, attended through a slot table, against dense attention and the general pass."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from quail.engine.kernels.paged_decode import gathered, paged_decode
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.packing import Row

SMALL_MODEL = True  # what these tests check holds for any model's arithmetic (tests/small_model.py)

H, HKV, D = 4, 2, 16


def test_gathered_attention_equals_dense_attention_per_sequence():
    """Sequences of different lengths, slots scattered over the pool, the table wider than some of them
    (its spare columns ignored): each sequence's output and log-sum-exp as dense attention over its keys."""
    torch.manual_seed(0)
    keys, values = torch.randn(600, HKV, D), torch.randn(600, HKV, D)
    lengths = torch.tensor([1, 7, 40, 129])
    table = torch.from_numpy(np.random.default_rng(0).permutation(600)[:4 * 129].reshape(4, 129).astype(np.int32))
    q = torch.randn(4, H, D)
    out, lse = gathered(q, keys, values, table, lengths)
    torch.testing.assert_close(paged_decode(q, keys, values, table, lengths), out)
    for b, n in enumerate(lengths.tolist()):
        at = table[b, :n].long()
        k, v = keys[at].transpose(0, 1), values[at].transpose(0, 1)  # (kv_heads, n, d)
        want = F.scaled_dot_product_attention(q[b][:, None], k, v, enable_gqa=True)[:, 0]
        torch.testing.assert_close(out[b], want, atol=1e-5, rtol=1e-5)
        scores = (q[b].view(HKV, H // HKV, D) @ k.transpose(-1, -2)).reshape(H, n) * D ** -0.5
        torch.testing.assert_close(lse[b], torch.logsumexp(scores, -1), atol=1e-5, rtol=1e-5)


def test_a_decode_step_gives_the_general_pass_hidden_states_and_kv(runtime):
    """Rows of one token after prompts in the pool: as decode steps (slot tables, Decoder.decode) and as
    rows after their runs (the general pass), the same hidden states and the same new keys (fp32); and the
    same with each row's token fed from a tensor instead of its ids."""
    runner = runtime.runner
    rng = np.random.default_rng(1)
    prompts = [rng.integers(100, 20000, n).astype(np.int64) for n in (5, 33, 70)]
    _, runs = runner.forward([Row(p, keep=len(p)) for p in prompts], Stats())
    assert all(len(run.parts) == 1 and run.parts[0][0] is runner.pool for run in runs)
    tokens = [np.array([t], dtype=np.int64) for t in rng.integers(100, 20000, len(prompts))]
    stats = Stats()
    stepped, stepped_kv = runner.forward([Row(t, keep=1, slots=r.parts[0][1]) for t, r in zip(tokens, runs)], stats)
    general, general_kv = runner.forward([Row(t, run, keep=1) for t, run in zip(tokens, runs)], Stats())
    torch.testing.assert_close(stepped, general, atol=1e-4, rtol=1e-4)
    for a, b in zip(stepped_kv, general_kv):
        assert len(a) == len(b) == 1
        for layer in range(runtime.config.num_layers):
            torch.testing.assert_close(a.layer(layer)[0], b.layer(layer)[0], atol=1e-5, rtol=1e-5)
    assert (stats.fresh_tokens, stats.kv_read, stats.kv_written) == (3, 5 + 33 + 70, 3)
    # The same tokens fed from a tensor (as decode.py feeds tokens chosen on the device), out of order and
    # beside other elements, the rows' own ids placeholders: the same hidden states both ways.
    source = torch.tensor([7, int(tokens[2][0]), 9, int(tokens[0][0]), int(tokens[1][0])])
    placeholder = np.zeros(1, dtype=np.int64)
    fed_step, _ = runner.forward([Row(placeholder, keep=1, slots=r.parts[0][1], fed=(source, index))
                                  for r, index in zip(runs, (3, 4, 1))], Stats())
    fed_general, _ = runner.forward([Row(placeholder, run, keep=1, fed=(source, index))
                                     for run, index in zip(runs, (3, 4, 1))], Stats())
    torch.testing.assert_close(fed_step, stepped, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(fed_general, general, atol=1e-6, rtol=1e-6)


def test_a_token_chosen_after_a_prompt_the_tree_let_go_of_follows_the_rest_of_it():
    """A sequence whose prompt lost its last tokens from the tree between prefill and decode computes
    those, then the token chosen after the prompt, in one row; a sequence with nothing left of its prompt
    takes the token from the device tensor; the last token max_tokens allows is not fed."""
    from quail.engine.kv.pool import KVPool
    from quail.engine.runtime.decode import Decoding, _Sequence

    pool = KVPool(1, 1, 4, torch.float32, torch.device("cpu"), 8)
    chosen = torch.tensor([9, 11])
    rest = _Sequence(pool, np.array([5, 6, 7], dtype=np.int32), seed=0)
    rest.chose(chosen, 0, Decoding(4))
    assert rest.waiting == 4 and rest.row(4).ids.tolist() == [5, 6, 7, 9] and rest.row(4).fed is None
    whole = _Sequence(pool, np.empty(0, dtype=np.int32), seed=0)
    whole.chose(chosen, 1, Decoding(4))
    assert whole.waiting == 1 and whole.row(1).fed == (chosen, 1)
    last = _Sequence(pool, np.empty(0, dtype=np.int32), seed=0)
    last.chose(chosen, 1, Decoding(1))
    assert last.waiting == 0 and last.owed == 1
