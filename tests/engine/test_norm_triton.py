"""The decoder's RMSNorm by the Triton kernel against the model's RMSNorm in fp32 (GPU only; skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels run on CUDA", allow_module_level=True)

from quail.engine.kernels import norm_triton  # noqa: E402
from quail.engine.model.decoder import RMSNorm  # noqa: E402

EPS = 1e-6


def _reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    norm = RMSNorm(x.shape[1], EPS).to("cuda")
    norm.weight.data.copy_(weight.float())
    return norm(x.float())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens, hidden", [(1, 64), (37, 1024), (513, 2560), (0, 1024), (5, 1000), (3, 8192)])
def test_rms_norm_matches_fp32(tokens, hidden, dtype):
    torch.manual_seed(tokens + hidden)
    x = 3 * torch.randn(tokens, hidden, device="cuda", dtype=dtype)
    weight = 1 + 0.1 * torch.randn(hidden, device="cuda", dtype=dtype)
    got = norm_triton.rms_norm(x, weight, EPS)
    assert got.shape == x.shape and got.dtype == dtype
    if tokens:
        torch.testing.assert_close(got.float(), _reference(x, weight), rtol=1e-2, atol=1e-2)  # one rounding


def test_rms_norm_reads_rows_at_any_stride_and_leaves_them_as_they_were():
    torch.manual_seed(1)
    wide = torch.randn(40, 3 * 1024, device="cuda", dtype=torch.bfloat16)
    x, before = wide[:, 1024:2048], wide.clone()
    weight = torch.rand(1024, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(norm_triton.rms_norm(x, weight, EPS).float(), _reference(x, weight),
                               rtol=1e-2, atol=1e-2)
    assert torch.equal(wide, before)
