"""The SwiGLU block's Triton kernel against silu(gate) · up in fp32 (GPU only; skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels run on CUDA", allow_module_level=True)

from quail.engine.kernels import mlp_triton  # noqa: E402
from quail.engine.kernels.swiglu import swiglu  # noqa: E402


@pytest.mark.parametrize("rows, inter", [(1, 16), (37, 3072), (513, 9728), (0, 256), (3, 1000)])
def test_silu_mul_matches_fp32(rows, inter):
    torch.manual_seed(rows)
    gate_up = torch.randn(rows, 2 * inter, device="cuda", dtype=torch.bfloat16)
    got = mlp_triton.silu_mul(gate_up)
    assert got.shape == (rows, inter) and got.dtype == torch.bfloat16
    if rows:
        want = F.silu(gate_up[:, :inter].float()) * gate_up[:, inter:].float()
        torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)  # one bf16 rounding


def test_silu_mul_reads_rows_at_any_stride():
    wide = torch.randn(40, 3 * 512, device="cuda", dtype=torch.float16)
    gate_up = wide[:, :1024]  # rows 1,536 apart
    want = F.silu(gate_up[:, :512].float()) * gate_up[:, 512:].float()
    torch.testing.assert_close(mlp_triton.silu_mul(gate_up).float(), want, rtol=1e-2, atol=1e-2)


@torch.inference_mode()
def test_the_block_takes_the_kernel_inside_a_compiled_region_at_any_token_count():
    torch.manual_seed(0)
    gate_up = nn.Linear(256, 1024, bias=False, device="cuda", dtype=torch.bfloat16)
    down = nn.Linear(512, 256, bias=False, device="cuda", dtype=torch.bfloat16)
    block = torch.compile(lambda t: swiglu(gate_up, down, t), dynamic=True)
    for rows in (64, 17, 300):
        x = torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16)
        g, u = (x.float() @ gate_up.weight.float().T).chunk(2, dim=-1)
        want = (F.silu(g) * u) @ down.weight.float().T
        got = block(x).float()
        assert float((got - want).norm() / want.norm()) < 1e-2
