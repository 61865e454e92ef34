"""The Triton attention kernel against fp32 attention, alone and in packed attention (GPU only; else skipped)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels run on CUDA", allow_module_level=True)

from quail.engine.kernels import attention_triton as attention_kernels  # noqa: E402
from quail.engine.kernels.attention import _matmuls, attention  # noqa: E402
from quail.engine.kernels.pass_rows import Rows, query_blocks  # noqa: E402
from quail.engine.kv.runs import KV  # noqa: E402

H, HKV, D = 32, 8, 128
BF16_REL = 2e-2  # bf16 inputs and probabilities (8 mantissa bits), fp32 accumulation


def _offsets(counts: list[int]) -> torch.Tensor:
    return torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.int32, device="cuda")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _spans(counts: list[int], runs: list[int]) -> list[tuple[int, int, int]]:
    starts = np.concatenate([[0], np.cumsum(counts)])
    return [(starts[i], starts[i + 1], run) for i, run in enumerate(runs)]


@pytest.mark.parametrize("block", [64, 128])
def test_rows_after_copied_keys_match_fp32(block):
    """Own keys only: each row's queries over its keys (copied ones first), causal, a block per row part."""
    torch.manual_seed(block)
    lengths, before = [1, 63, 64, 65, 300, 7, 129], [0, 0, 40, 3, 0, 500, 64]
    keys = [n + b for n, b in zip(lengths, before)]
    q = torch.randn(sum(lengths), H, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(keys), HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cu_q, cu_k = _offsets(lengths), _offsets(keys)
    q_rows = torch.from_numpy(np.repeat(np.arange(len(lengths)), lengths).astype(np.int32)).cuda()
    blocks = torch.from_numpy(query_blocks(_spans(lengths, [-1] * len(lengths)), block)).cuda()
    out, lse = attention_kernels.packed_attention(q, blocks, block, (k, v, cu_q, cu_k, q_rows))
    for b in range(len(lengths)):
        rows, cols = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        spans = ((q, rows), (k, cols), (v, cols))
        want, want_lse = _matmuls(*(t[span].float().transpose(0, 1)[None] for t, span in spans), True)
        assert _rel(out[rows], want[0].transpose(0, 1)) < BF16_REL
        torch.testing.assert_close(lse[rows], want_lse[0].transpose(0, 1), atol=2e-2, rtol=0)


def test_the_output_is_written_where_asked():
    """Given `out` (a view of a larger buffer), the kernel writes its output there, what it gives without,
    and leaves the rest of the buffer."""
    torch.manual_seed(3)
    lengths = [5, 70, 130]
    q = torch.randn(sum(lengths), H, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lengths), HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cu = _offsets(lengths)
    q_rows = torch.from_numpy(np.repeat(np.arange(len(lengths)), lengths).astype(np.int32)).cuda()
    blocks = torch.from_numpy(query_blocks(_spans(lengths, [-1] * len(lengths)), 64)).cuda()
    buffer = torch.full((sum(lengths) + 50, H, D), 7.0, device="cuda", dtype=torch.bfloat16)
    alone, _ = attention_kernels.packed_attention(q, blocks, 64, (k, v, cu, cu, q_rows))
    written, _ = attention_kernels.packed_attention(q, blocks, 64, (k, v, cu, cu, q_rows), out=buffer[:len(q)])
    assert written.data_ptr() == buffer.data_ptr() and torch.equal(written, alone)
    assert bool((buffer[len(q):] == 7).all())


@pytest.mark.parametrize("own", [False, True])
def test_rows_of_a_run_match_fp32(own):
    """Rows continuing runs: every query over its run's keys (in full) and, with `own`, its own row's keys
    (causal), in blocks that span several rows of a run; a row of no run in between."""
    torch.manual_seed(11 + own)
    lengths, row_runs, run_lengths = [12, 3, 40, 70, 9, 33, 1, 150], [0, 0, 0, -1, 1, 1, 1, 1], [700, 64]
    runs = [(torch.randn(n, HKV, D, device="cuda", dtype=torch.bfloat16),
             torch.randn(n, HKV, D, device="cuda", dtype=torch.bfloat16)) for n in run_lengths]
    q = torch.randn(sum(lengths), H, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lengths), HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cu_q = _offsets(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    spans = [(starts[0], starts[3], 0), (starts[4], starts[8], 1)] + ([(starts[3], starts[4], -1)] if own else [])
    blocks = torch.from_numpy(query_blocks(spans, 64)).cuda()
    assert int((blocks[:, 1] > 0).sum()) == len(blocks) and any(
        int(b[2]) == 1 and int(b[1]) == 64 for b in blocks), "a block across rows of a run"
    q_rows = torch.from_numpy(np.repeat(np.arange(len(lengths)), lengths).astype(np.int32)).cuda()
    run_k, run_v = torch.cat([r[0] for r in runs]), torch.cat([r[1] for r in runs])
    out, lse = attention_kernels.packed_attention(q, blocks, 64, (k, v, cu_q, cu_q, q_rows) if own else None,
                                                  (run_k, run_v, _offsets(run_lengths)))
    for b, run in enumerate(row_runs):
        if run < 0 and not own:
            continue
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        parts = [(runs[run][0], runs[run][1])] if run >= 0 else []
        n = lengths[b]
        keys = torch.cat([p[0] for p in parts] + ([k[rows]] if own else []))
        values = torch.cat([p[1] for p in parts] + ([v[rows]] if own else []))
        allowed = torch.ones(n, len(keys), dtype=torch.bool, device="cuda")
        if own:
            allowed[:, len(keys) - n:] = torch.ones(n, n, dtype=torch.bool, device="cuda").tril()
        scores = torch.einsum("qhd,khd->hqk", q[rows].float(), keys.float().repeat_interleave(H // HKV, 1)) * D ** -0.5
        scores = scores.masked_fill(~allowed, float("-inf"))
        want = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values.float().repeat_interleave(H // HKV, 1))
        assert _rel(out[rows], want) < BF16_REL
        torch.testing.assert_close(lse[rows], scores.logsumexp(-1).transpose(0, 1), atol=2e-2, rtol=0)


def test_packed_attention_with_runs_and_chains_matches_fp32():
    """Varlen layout on the GPU: own tokens (after copied runs and chains) and long runs in one call of the
    Triton kernel; against the fp32 reference path."""
    torch.manual_seed(7)
    lengths = [37, 300, 5, 120, 64, 90]
    runs = [KV.of([torch.randn(c, HKV, D, device="cuda", dtype=torch.bfloat16)],
               [torch.randn(c, HKV, D, device="cuda", dtype=torch.bfloat16)]) for c in (2500, 40)]
    pasts = [runs[0], runs[0], None, runs[1], runs[1], runs[1]]
    parents = [None, 0, None, None, 3, 3]  # row 1 continues row 0 after their long run: run, chain, own
    q = torch.randn(sum(lengths), H, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lengths), HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    as_fp32 = {id(r): KV.of(*([t.float()] for t in r.layer(0))) for r in runs}
    reference = Rows.build(lengths, [None if p is None else as_fp32[id(p)] for p in pasts], torch.device("cuda"),
                           parents=parents)
    want = attention(q.float(), k.float(), v.float(), reference, 0)
    layout = Rows.build(lengths, pasts, torch.device("cuda"), padded=False, parents=parents)
    assert layout.runs and layout.packed.own_index is not None, "one run apart (with a chain after it), one copied, chains copied"
    assert _rel(attention(q, k, v, layout, 0), want) < BF16_REL


@pytest.mark.parametrize("padded", [False, True])
def test_runs_in_one_pool_are_read_in_place_and_match_fp32(padded):
    """Rows after runs held in the device's pool (as the runtime keeps them: slots scattered, a run a
    slice of another) are attended with the runs' keys read in place through their slot table, in the one
    call of unpadded rows and in the runs' own call of padded ones; against fp32."""
    from quail.engine.kv.pool import KVPool

    torch.manual_seed(3)
    pool = KVPool(2, HKV, D, torch.bfloat16, torch.device("cuda"), 4096)
    slots = pool.take(3000)
    for layer in range(2):
        pool.write(layer, torch.from_numpy(slots[::-1].copy()).cuda(),
                   *(torch.randn(3000, HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2)))
    whole = KV(((pool, slots[::-1].copy()),))
    runs = [whole.slice(0, 2500), whole.slice(2500, 2900), whole.slice(100, 700)]
    lengths = [5, 9, 3, 40, 2, 6]
    pasts = [runs[0], runs[0], runs[1], runs[1], runs[2], runs[2]]
    q = torch.randn(sum(lengths), H, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lengths), HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    layout = Rows.build(lengths, pasts, torch.device("cuda"), padded=padded)
    assert layout.run_slots is not None and len(layout.runs) == 3, "three runs apart, one slot table"
    for layer in range(2):
        as_fp32 = {id(r): KV.of(*([t.float()] for t in r.layer(layer))) for r in runs}
        reference = Rows.build(lengths, [as_fp32[id(p)] for p in pasts], torch.device("cuda"))
        want = attention(q.float(), k.float(), v.float(), reference, 0)
        assert _rel(attention(q, k, v, layout, layer), want) < BF16_REL


def test_rows_whose_keys_are_gathered_from_the_pool_attend_as_with_copies():
    """A pass that writes its tokens' KV into the pool holding its copied runs gathers each row's keys
    (copied run, chain, own) from there: the kernel's output is bit for bit the one from copies."""
    from quail.engine.kv.pool import KVPool

    torch.manual_seed(9)
    pool = KVPool(2, HKV, D, torch.bfloat16, torch.device("cuda"), 8192)
    preamble = KV(((pool, pool.take(24)),))
    anchor = KV(((pool, pool.take(3000)),))
    lengths = [37, 300, 5, 120, 64, 90, 400]
    pasts = [preamble, preamble, preamble, anchor, anchor, None, preamble]
    parents = [None, 0, 0, None, 3, None, None]
    written = pool.take(sum(lengths))
    for layer in range(2):
        for slots in (preamble.parts[0][1], anchor.parts[0][1]):
            pool.write(layer, torch.from_numpy(slots).cuda(),
                       *(torch.randn(len(slots), HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2)))
    copies = Rows.build(lengths, pasts, torch.device("cuda"), padded=False, parents=parents)
    gathered = Rows.build(lengths, pasts, torch.device("cuda"), padded=False, parents=parents,
                          written=(pool, written))
    assert gathered.packed.key_slots is not None and copies.packed.key_slots is None
    for layer in range(2):
        q = torch.randn(sum(lengths), H, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(sum(lengths), HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        pool.write(layer, torch.from_numpy(written).cuda(), k, v)
        assert torch.equal(attention(q, k, v, gathered, layer), attention(q, k, v, copies, layer))
