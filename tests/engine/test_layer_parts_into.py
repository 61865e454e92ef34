"""A layer's parts written into given buffers (what captured passes replay) against the parts returning their
outputs, eager and compiled, on the CPU (the captured passes themselves: test_pass_graphs_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from quail.engine.model.config import ModelConfig
from quail.engine.model.decoder import Decoder

CFG = ModelConfig("qwen3", vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                  intermediate_size=128, rope_theta=1e6, rms_norm_eps=1e-6, qk_norm=True)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_parts_written_into_buffers_are_the_parts_returned(compiled):
    """q, k and v written into views of larger buffers, and the hidden states written back into theirs, hold
    what qkv and finish return, bit for bit, for two token counts (one compiled graph of any count); the
    buffers' rows past the views are left as they were."""
    torch.manual_seed(0)
    model = Decoder(CFG).eval()
    if compiled:
        model.compile_layers()
    rows = 128
    q, attn = (torch.full((rows, CFG.num_heads, CFG.head_dim), 7.0) for _ in range(2))
    k, v = (torch.full((rows, CFG.num_kv_heads, CFG.head_dim), 7.0) for _ in range(2))
    x = torch.full((rows, CFG.hidden_size), 7.0)
    with torch.inference_mode():
        for n in (37, 100):
            hidden, cos, sin = model.embedded(torch.randint(0, CFG.vocab_size, (n,)), torch.arange(n))
            x[:n].copy_(hidden)
            model.qkv_into(1, x[:n], cos, sin, (q[:n], k[:n], v[:n]))
            for written, returned in zip((q, k, v), model.qkv(1, hidden, cos, sin)):
                assert torch.equal(written[:n], returned) and bool((written[n:] == 7).all())
            attn[:n].normal_()
            model.finish_into(1, x[:n], attn[:n])
            assert torch.equal(x[:n], model.finish(1, hidden, attn[:n])) and bool((x[n:] == 7).all())
