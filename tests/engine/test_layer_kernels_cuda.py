"""A layer run by our kernels alone (DecoderLayer.by_kernels) against the same layer in fp32 (GPU only; else skipped)."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels run on CUDA", allow_module_level=True)

from quail.engine.kernels.fp8 import to_fp8  # noqa: E402
from quail.engine.kernels.pass_rows import Rows  # noqa: E402
from quail.engine.model.config import ModelConfig  # noqa: E402
from quail.engine.model.decoder import Decoder, DecoderLayer, rope_tables  # noqa: E402

QWEN3 = ModelConfig("qwen3", vocab_size=512, hidden_size=256, num_layers=2, num_heads=8, num_kv_heads=4,
                    head_dim=32, intermediate_size=768, rope_theta=1e6, rms_norm_eps=1e-6, qk_norm=True)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _model(cfg: ModelConfig, dtype: torch.dtype) -> Decoder:
    torch.manual_seed(0)
    model = Decoder(cfg)
    for name, param in model.named_parameters():
        param.data.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.1 if name.endswith("norm.weight") else 0.05)
    return model.to("cuda", dtype).eval()


@torch.inference_mode()
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_layer_by_our_kernels_matches_fp32_and_writes_its_result_into_x(dtype):
    """qkv and finish by the kernels are within one rounding's error of the fp32 layer; finish returns x itself
    holding the result, and finish_into leaves the same there; compile_layers leaves such layers eager."""
    model = _model(QWEN3, dtype)
    layer = model.layers[0]
    reference = copy.deepcopy(layer).float()
    assert layer.by_kernels(model.embed_tokens.weight) and not reference.by_kernels(torch.ones(1, device="cuda"))
    t = 300
    x = torch.randn(t, QWEN3.hidden_size, device="cuda", dtype=dtype)
    cos, sin = rope_tables(torch.arange(t, device="cuda"), QWEN3.head_dim, QWEN3.rope_theta)
    for got, want in zip(DecoderLayer.qkv(layer, x, cos.to(dtype), sin.to(dtype)),
                         DecoderLayer.qkv(reference, x.float(), cos, sin)):
        assert _rel(got, want) < 1e-2
    attn = torch.randn(t, QWEN3.num_heads, QWEN3.head_dim, device="cuda", dtype=dtype)
    want = DecoderLayer.finish(reference, x.float(), attn.float())
    into = x.clone()
    got = DecoderLayer.finish(layer, into, attn)
    assert got is into and _rel(got, want) < 1e-2
    into = x.clone()
    model.finish_into(0, into, attn)
    assert torch.equal(into, got)
    model.compile_layers()
    assert model._finish is DecoderLayer.finish and model._qkv is DecoderLayer.qkv


@torch.inference_mode()
def test_a_whole_pass_by_our_kernels_matches_fp32():
    """A pass of three rows through every layer: final hidden states within bf16 error of the fp32 model's."""
    model = _model(QWEN3, torch.bfloat16)
    exact = _model(QWEN3, torch.float32)
    lengths = [40, 129, 7]
    ids = torch.randint(0, QWEN3.vocab_size, (sum(lengths),), device="cuda")
    positions = torch.cat([torch.arange(n, device="cuda") for n in lengths])
    last = torch.cumsum(torch.tensor(lengths, device="cuda"), 0) - 1
    hidden = [m(ids, positions, Rows.build(lengths, [None] * 3, torch.device("cuda"), m.padded_attention), last)
              for m in (model, exact)]
    assert _rel(*hidden) < 2e-2


def test_layers_the_kernels_do_not_cover_keep_the_torch_path():
    """Without q/k norms (Llama, Qwen2), with fp8 layers, in fp32 or on the CPU: not by the kernels."""
    llama = _model(ModelConfig("llama", vocab_size=512, hidden_size=256, num_layers=1, num_heads=8, num_kv_heads=4,
                               head_dim=32, intermediate_size=768, rope_theta=1e4, rms_norm_eps=1e-6),
                   torch.bfloat16)
    assert not llama.layers[0].by_kernels(llama.embed_tokens.weight)
    fp8 = _model(QWEN3, torch.bfloat16)
    to_fp8(fp8.layers)
    assert not fp8.layers[0].by_kernels(fp8.embed_tokens.weight)
    assert not _model(QWEN3, torch.float32).layers[0].by_kernels(torch.ones(1, device="cuda"))
    assert not _model(QWEN3, torch.bfloat16).layers[0].by_kernels(torch.ones(1, dtype=torch.bfloat16))
