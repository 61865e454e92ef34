"""The fp8 path's Triton quantization kernels against their torch references (GPU only; skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels run on CUDA", allow_module_level=True)

from quail.engine.kernels import fp8  # noqa: E402

from quail.engine.kernels import fp8_triton as fp8_kernels


def _dequantized(quantized: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    values, scale = quantized
    return values.float() * scale


@pytest.mark.parametrize("rows, cols", [(1, 16), (37, 2560), (513, 9728), (0, 4096), (3, 20000)])
def test_silu_mul_quantization_matches_torch(rows, cols):
    torch.manual_seed(rows)
    gate, up = (torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    want = F.silu(gate.float()) * up.float()
    got, reference = fp8_kernels.silu_mul_rows(gate, up), fp8.silu_mul_rows(gate, up)
    assert got[0].dtype == fp8.FP8 and got[1].shape == (rows, 1)
    if rows:
        torch.testing.assert_close(got[1], reference[1], rtol=1e-2, atol=0)
        error = (_dequantized(got) - want).norm() / want.norm()
        # e4m3 keeps 3 mantissa bits: ~2.6% relative error, as torch's own quantization of the bf16 product
        assert error < 0.03 and error <= (_dequantized(reference) - want).norm() / want.norm() * 1.05


@pytest.mark.parametrize("rows, cols", [(5, 4096), (300, 4096), (2, 1000), (2, 17000)])
def test_row_quantization_matches_torch(rows, cols):
    torch.manual_seed(cols)
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * torch.rand(rows, 1, device="cuda") * 10
    got, reference = fp8_kernels.quantize_rows(x), fp8.quantize_rows(x)
    torch.testing.assert_close(got[1], reference[1], rtol=1e-6, atol=0)
    assert torch.equal(got[0].float(), reference[0].float())


@torch.inference_mode()
def test_fp8_layers_use_the_kernels_and_agree_with_torch():
    torch.manual_seed(1)
    down = torch.nn.Linear(512, 256, bias=False, device="cuda", dtype=torch.bfloat16)
    layer = fp8.Fp8Linear(down)
    gate, up = (torch.randn(40, 512, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    want = down(F.silu(gate) * up).float()
    for got in (fp8.silu_mul_project(layer, gate, up), fp8.project(layer, F.silu(gate) * up)):
        assert float((got.float() - want).norm() / want.norm()) < 0.06
