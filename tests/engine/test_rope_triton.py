"""Qwen3's q/k norms and rotation by the Triton kernel against the model's RMSNorm and rope in fp32 (GPU only)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("the Triton kernels run on CUDA", allow_module_level=True)

from quail.engine.kernels import rope_triton  # noqa: E402
from quail.engine.model.config import ModelConfig  # noqa: E402
from quail.engine.model.decoder import Attention, rope_tables  # noqa: E402

EPS = 1e-6


def _reference(joined: torch.Tensor, heads: int, kv_heads: int, qw: torch.Tensor, kw: torch.Tensor,
               cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each head normed by its weight, then rotated by the half-rotation tables, all in fp32."""
    d, t = qw.shape[0], joined.shape[0]
    x = joined.float()

    def normed_rotated(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * w.float()
        turned = torch.cat((-h[..., d // 2:], h[..., :d // 2]), dim=-1)
        return h * cos.float()[:, None] + turned * sin.float()[:, None]

    return (normed_rotated(x[:, :heads * d].view(t, heads, d), qw),
            normed_rotated(x[:, heads * d:(heads + kv_heads) * d].view(t, kv_heads, d), kw))


def _inputs(tokens: int, heads: int, kv_heads: int, d: int, dtype: torch.dtype, seed: int) -> tuple:
    torch.manual_seed(seed)
    joined = torch.randn(tokens, (heads + 2 * kv_heads) * d, device="cuda", dtype=dtype)  # q, k and v heads
    qw, kw = (1 + 0.1 * torch.randn(d, device="cuda", dtype=dtype) for _ in range(2))
    positions = torch.randint(0, 30000, (tokens,), device="cuda")
    cos, sin = (t.to(dtype) for t in rope_tables(positions, d, 1e6))
    return joined, qw, kw, cos, sin


@pytest.mark.parametrize("tokens, heads, kv_heads, d", [(1, 16, 8, 128), (37, 32, 8, 128), (513, 16, 8, 64),
                                                         (0, 16, 8, 128), (100, 14, 2, 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_norm_rope_matches_fp32(tokens, heads, kv_heads, d, dtype):
    joined, qw, kw, cos, sin = _inputs(tokens, heads, kv_heads, d, dtype, tokens)
    q, k = rope_triton.norm_rope(joined, heads, kv_heads, qw, kw, EPS, cos, sin)
    assert q.shape == (tokens, heads, d) and k.shape == (tokens, kv_heads, d) and q.dtype == k.dtype == dtype
    want_q, want_k = _reference(joined, heads, kv_heads, qw, kw, cos, sin)
    torch.testing.assert_close(q.float(), want_q, rtol=2e-2, atol=2e-2)  # the normed head and the result rounded
    torch.testing.assert_close(k.float(), want_k, rtol=2e-2, atol=2e-2)


def test_norm_rope_writes_into_the_buffers_it_is_given():
    joined, qw, kw, cos, sin = _inputs(300, 16, 8, 128, torch.bfloat16, 1)
    q, k = torch.zeros(512, 16, 128, device="cuda", dtype=torch.bfloat16), torch.zeros(
        512, 8, 128, device="cuda", dtype=torch.bfloat16)
    got = rope_triton.norm_rope(joined, 16, 8, qw, kw, EPS, cos, sin, out=(q[:300], k[:300]))
    assert got[0].data_ptr() == q.data_ptr() and got[1].data_ptr() == k.data_ptr()
    want = rope_triton.norm_rope(joined, 16, 8, qw, kw, EPS, cos, sin)
    assert torch.equal(q[:300], want[0]) and torch.equal(k[:300], want[1])
    assert not q[300:].any() and not k[300:].any(), "nothing past the tokens' rows"


@torch.inference_mode()
def test_the_attention_projection_takes_the_kernel_inside_a_compiled_region_at_any_token_count():
    """Attention.project compiled for any token count (as the runner's layers are) gives the fp32 reference's
    q and k, and v as the joined projection's third part; into buffers, the same."""
    cfg = ModelConfig("qwen3", vocab_size=512, hidden_size=256, num_layers=1, num_heads=8, num_kv_heads=2,
                      head_dim=32, intermediate_size=512, rope_theta=1e6, rms_norm_eps=EPS, qk_norm=True)
    torch.manual_seed(0)
    attention = Attention(cfg).to("cuda", torch.bfloat16)
    for norm in (attention.q_norm, attention.k_norm):
        norm.weight.data = 1 + 0.1 * torch.randn_like(norm.weight)
    project = torch.compile(attention.project, dynamic=True)
    for tokens in (64, 17, 300):
        x = torch.randn(tokens, 256, device="cuda", dtype=torch.bfloat16)
        cos, sin = (t.to(torch.bfloat16) for t in rope_tables(torch.arange(tokens, device="cuda"), 32, 1e6))
        joined = attention.qkv_proj(x)
        want_q, want_k = _reference(joined, 8, 2, attention.q_norm.weight, attention.k_norm.weight, cos, sin)
        buffers = tuple(torch.empty(tokens, h, 32, device="cuda", dtype=torch.bfloat16) for h in (8, 2, 2))
        for q, k, v in (project(x, cos, sin), project(x, cos, sin, buffers)):
            torch.testing.assert_close(q.float(), want_q, rtol=2e-2, atol=2e-2)
            torch.testing.assert_close(k.float(), want_k, rtol=2e-2, atol=2e-2)
            torch.testing.assert_close(v, joined[:, 320:].reshape(tokens, 2, 32), rtol=1e-2, atol=1e-2)
