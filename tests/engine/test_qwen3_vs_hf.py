"""The Qwen3 path (per-head q/k RMSNorm, untied head) against HF transformers, tiny random weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quail.engine.model.config import ModelConfig
from quail.engine.model.decoder import Decoder
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.model_runner import ModelRunner
from quail.engine.runtime.packing import Row

LABELS = torch.tensor([3, 99, 200, 511])


@pytest.fixture(scope="module")
def models():
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
    ours.load_state_dict({k.removeprefix("model."): v for k, v in hf.state_dict().items()}, strict=True)
    return ours, hf


def hf_label_logits(hf, ids: np.ndarray) -> torch.Tensor:
    with torch.inference_mode():
        return hf(torch.from_numpy(ids.astype(np.int64))[None]).logits[0, -1, LABELS]


def test_packed_batch_matches_hf(models):
    ours, hf = models
    rng = np.random.default_rng(1)
    rows = [rng.integers(0, 512, n).astype(np.int32) for n in (17, 5, 40)]
    hidden, _ = ModelRunner(ours).forward([Row(ids) for ids in rows], Stats())
    with torch.inference_mode():
        got = ours.label_logits(hidden, LABELS)
    want = torch.stack([hf_label_logits(hf, ids) for ids in rows])
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


def test_suffixes_after_a_shared_anchor_match_hf(models):
    ours, hf = models
    runner = ModelRunner(ours)
    rng = np.random.default_rng(0)
    anchor = rng.integers(0, 512, 33).astype(np.int32)
    suffixes = [rng.integers(0, 512, n).astype(np.int32) for n in (1, 4, 9, 20)]
    _, (kv,) = runner.forward([Row(anchor, keep=len(anchor))], Stats())
    hidden, _ = runner.forward([Row(s, kv) for s in suffixes], Stats())
    with torch.inference_mode():
        got = ours.label_logits(hidden, LABELS)
    want = torch.stack([hf_label_logits(hf, np.concatenate([anchor, s])) for s in suffixes])
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
