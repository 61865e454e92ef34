"""Decode steps on CUDA: the Triton decode kernel against its reference, and captured step graphs against eager steps (GPU only; else skipped)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("decode kernels and step graphs run on CUDA", allow_module_level=True)

from quail.engine.kernels import paged_decode_triton  # noqa: E402
from quail.engine.kernels.paged_decode import gathered  # noqa: E402
from quail.engine.kv.pool import KVPool  # noqa: E402
from quail.engine.model.config import ModelConfig  # noqa: E402
from quail.engine.model.decoder import Decoder  # noqa: E402
from quail.engine.runtime.packing import Row  # noqa: E402
from quail.engine.runtime.step_graphs import StepGraphs  # noqa: E402

H, HKV, D = 32, 8, 128


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("block_n", [32, 64, 128])
def test_the_decode_kernel_matches_the_gathered_reference(block_n):
    torch.manual_seed(block_n)
    keys = torch.randn(8192, HKV, D, device="cuda", dtype=torch.bfloat16)
    values = torch.randn(8192, HKV, D, device="cuda", dtype=torch.bfloat16)
    lengths = torch.tensor([1, 2, 63, 64, 65, 300, 1000], device="cuda")
    table = torch.randint(0, 8192, (len(lengths), 1024), device="cuda", dtype=torch.int32)
    q = torch.randn(len(lengths), H, D, device="cuda", dtype=torch.bfloat16)
    got = paged_decode_triton.paged_decode(q, keys, values, table, lengths, block_n=block_n)
    want = gathered(q.float(), keys.float(), values.float(), table, lengths)[0]
    for b in range(len(lengths)):
        assert _rel(got[b], want[b]) < 2e-2


def test_captured_steps_equal_eager_steps_for_any_batch_and_leave_other_slots_alone():
    """Steps of 3, 11 and 3 sequences (two graphs, one replayed with shorter tables than before, its ids fed
    from a device tensor): each the eager step's hidden states; no slot but the new tokens' and the scratch
    slot written."""
    torch.manual_seed(0)
    cfg = ModelConfig("qwen3", vocab_size=512, hidden_size=256, num_layers=2, num_heads=8, num_kv_heads=2,
                      head_dim=32, intermediate_size=512, rope_theta=1e6, rms_norm_eps=1e-6, qk_norm=True)
    model = Decoder(cfg).to("cuda", torch.bfloat16).eval()
    pool = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, torch.device("cuda"), 4096)
    for layer in range(cfg.num_layers):
        pool.keys[layer].normal_()
        pool.values[layer].normal_()
    graphs = StepGraphs(model, pool)
    assert graphs.usable()
    rng = np.random.default_rng(0)
    for batch, width in ((3, 40), (11, 300), (3, 17)):
        lengths = rng.integers(1, width + 1, batch)
        lengths[0] = width
        table = rng.choice(np.arange(1, 4096), size=(batch, width), replace=False).astype(np.int32)
        new = table[np.arange(batch), lengths - 1].astype(np.int64)
        ids = rng.integers(0, cfg.vocab_size, batch)
        before = [t.clone() for t in pool.keys]
        rows = [Row(ids[b:b + 1]) for b in range(batch)]
        if batch == 3 and width == 17:  # the ids fed from the device, out of order, the host's placeholders
            source = torch.from_numpy(ids[::-1].copy()).cuda()
            rows = [Row(np.zeros(1, np.int64), fed=(source, batch - 1 - b)) for b in range(batch)]
        with torch.inference_mode():
            got = graphs(np.array([r.ids[0] for r in rows]), lengths - 1, new, table, lengths, rows)
            after = [t.clone() for t in pool.keys]
            want = model.decode(*(torch.from_numpy(a).cuda() for a in (ids, lengths - 1, new, table, lengths)),
                                pool.keys, pool.values)
        assert _rel(got, want) < 1e-2
        others = torch.ones(4096, dtype=torch.bool, device="cuda")
        others[torch.from_numpy(new).cuda()] = False
        others[int(graphs._scratch.parts[0][1][0])] = False
        for layer in range(cfg.num_layers):
            assert torch.equal(after[layer][others], before[layer][others])
    assert set(graphs.graphs) == {8, 16}
