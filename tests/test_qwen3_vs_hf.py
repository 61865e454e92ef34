"""The Qwen3 path (per-head q/k RMSNorm, untied head) against HF transformers, tiny random weights."""

from __future__ import annotations

import pytest
import torch

from quail.engine.config import ModelConfig
from quail.engine.model import Decoder


def test_qwen3_label_logits_match_hf():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_config = transformers.Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=256, rope_theta=1e6, tie_word_embeddings=False,
    )
    hf = transformers.Qwen3ForCausalLM(hf_config).eval()
    config = ModelConfig.from_hf(hf_config.to_dict())
    assert config.qk_norm and not config.tie_embeddings
    ours = Decoder(config).eval()
    state = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    ours.load_state_dict(state, strict=True)

    lengths = torch.tensor([17, 5, 40])
    ids = torch.randint(0, 512, (3, 40))
    labels = torch.tensor([3, 99, 200, 511])
    with torch.inference_mode():
        got = ours.label_logits(ids, lengths, labels)
        want = torch.stack([hf(ids[i : i + 1, : int(n)]).logits[0, -1, labels] for i, n in enumerate(lengths)])
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
