"""The Triton attention kernel against fp32 attention, alone and in packed attention (GPU only; else skipped)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels run on CUDA", allow_module_level=True)

from quail.engine import attention_kernels  # noqa: E402
from quail.engine.attention import Rows, _matmuls, attention, query_blocks  # noqa: E402
from quail.engine.kv import KV  # noqa: E402

H, HKV, D = 32, 8, 128
BF16_REL = 2e-2  # bf16 inputs and probabilities (8 mantissa bits), fp32 accumulation


def _offsets(counts: list[int]) -> torch.Tensor:
    return torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.int32, device="cuda")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block", [64, 128])
def test_rows_after_copied_keys_match_fp32(causal, block):
    torch.manual_seed(block)
    lengths, before = [1, 63, 64, 65, 300, 7, 129], [0, 0, 40, 3, 0, 500, 64]
    keys = [n + b for n, b in zip(lengths, before)]
    q = torch.randn(sum(lengths), H, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(keys), HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cu_q, cu_k = _offsets(lengths), _offsets(keys)
    blocks = torch.from_numpy(query_blocks(np.array(lengths), block)).cuda()
    out, lse = attention_kernels.varlen_attention(q, k, v, cu_q, cu_k, blocks, block, causal)
    for b in range(len(lengths)):
        rows, cols = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        spans = ((q, rows), (k, cols), (v, cols))
        want, want_lse = _matmuls(*(t[span].float().transpose(0, 1)[None] for t, span in spans), causal)
        assert _rel(out[rows], want[0].transpose(0, 1)) < BF16_REL
        torch.testing.assert_close(lse[rows], want_lse[0].transpose(0, 1), atol=2e-2, rtol=0)


def test_packed_attention_with_runs_and_chains_matches_fp32():
    """Varlen layout on the GPU: own tokens (after copied runs and chains) and long runs, both by the
    Triton kernel, merged; against the fp32 reference path."""
    torch.manual_seed(7)
    lengths = [37, 300, 5, 120, 64, 90]
    runs = [KV([torch.randn(c, HKV, D, device="cuda", dtype=torch.bfloat16)],
               [torch.randn(c, HKV, D, device="cuda", dtype=torch.bfloat16)]) for c in (2500, 40)]
    pasts = [runs[0], runs[0], None, runs[1], runs[1], runs[1]]
    parents = [None, None, None, None, 3, 3]
    q = torch.randn(sum(lengths), H, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lengths), HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    as_fp32 = {id(r): KV([r.keys[0].float()], [r.values[0].float()]) for r in runs}
    reference = Rows.build(lengths, [None if p is None else as_fp32[id(p)] for p in pasts], torch.device("cuda"),
                           parents=parents)
    want = attention(q.float(), k.float(), v.float(), reference, 0)
    layout = Rows.build(lengths, pasts, torch.device("cuda"), padded=False, parents=parents)
    assert layout.runs and layout.packed.own_index is not None, "one run apart, one copied, chains copied"
    assert _rel(attention(q, k, v, layout, 0), want) < BF16_REL
