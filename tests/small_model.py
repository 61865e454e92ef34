"""A small decoder of random weights behind the embedded model's tokenizer: for tests of planning and execution.

Tests whose answers come by content hash, or that compare one plan's or strategy's answers with another's,
need the runtime's every part (tokenizer, prompt layout, scheduler, KV pool and resident tree) but not the
embedded model's arithmetic, which is most of their time on a CPU. A module that sets `SMALL_MODEL = True`
gets this runtime as its `runtime` fixture (tests/conftest.py):

- two Llama layers of width 64 (2 query heads, 1 KV head), the embedded model's vocabulary, tokenizer and
  chat template, and its model id, so that content-hash answers are the embedded model's;
- weights drawn with a unit gain per layer (normal, std 1/sqrt(fan-in)): every output depends on every
  token before it, so a wrong KV or a wrong mask shows in the answers, as it would in the embedded model's;
- a KV pool of as many tokens as the embedded runtime's.

What the model answers is checked elsewhere with the embedded model itself (against HF transformers, and
through real servers).
"""

from __future__ import annotations

import math

import torch

from quail.engine.kv.pool import token_bytes
from quail.engine.model.config import ModelConfig
from quail.engine.model.decoder import Decoder
from quail.engine.runtime.runtime import Runtime

SMALL = ModelConfig(arch="llama", vocab_size=49152, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
                    head_dim=32, intermediate_size=128, rope_theta=100000.0, rms_norm_eps=1e-5,
                    tie_embeddings=True)


def small_runtime(embedded: Runtime) -> Runtime:
    """A runtime over a small random decoder ("quail" strategy) with `embedded`'s tokenizer, chat template,
    model id, token budget and pool size in tokens."""
    generator = torch.Generator().manual_seed(0)
    model = Decoder(SMALL).eval().requires_grad_(False)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            continue
        fan_in = param.shape[-1] if "embed" not in name else 1
        param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(fan_in))
    tokens = embedded.runner.pool.slots
    kv_bytes = tokens * token_bytes(SMALL.num_layers, SMALL.num_kv_heads, SMALL.head_dim, torch.float32)
    return Runtime(embedded.model_id, model, embedded.tokenizer, embedded.layout.frame, "quail",
                   embedded.runner.token_budget, kv_bytes=kv_bytes)
