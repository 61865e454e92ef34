"""The `hf` baseline: HF transformers over the same weights, padded batches in arrival order."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from quail.engine.model.config import ModelConfig
from quail.engine.model.decoder import Decoder
from quail.engine.runtime.counters import Stats, causal_pairs
from quail.engine.runtime.loading import building_on
from quail.engine.runtime.model_runner import ModelRunner
from quail.engine.runtime.requests import Request
from quail.engine.runtime.scheduler import PassScheduler
from quail.engine.runtime.packing import pack
from quail.engine.runtime.tree_job import Strategy


def hf_model(model: Decoder):
    """An HF causal LM with the decoder's own weights (same dtype and device)."""
    import transformers

    cfg: ModelConfig = model.config
    common = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        max_position_embeddings=cfg.max_position, tie_word_embeddings=cfg.tie_embeddings,
    )
    if cfg.arch == "qwen3":
        config, cls = transformers.Qwen3Config(**common), transformers.Qwen3ForCausalLM
    elif cfg.arch == "qwen2":
        config, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    else:
        config, cls = transformers.LlamaConfig(attention_bias=cfg.attention_bias, **common), transformers.LlamaForCausalLM
    weight = model.embed_tokens.weight
    with building_on(weight.device, weight.dtype), _without_random_init():  # every weight is assigned below
        hf = cls(config)
    state = {f"model.{k}": v for k, v in model.state_dict().items() if not k.startswith("lm_head")}
    state["lm_head.weight"] = model.head_weight()
    hf.load_state_dict(state, strict=True, assign=True)
    return hf.eval().requires_grad_(False)


def _without_random_init():
    """transformers' own switch that skips initializing a model's weights at random (seconds of a CPU for a
    135M model) when they are all loaded afterwards; its module moved in transformers 5."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        from transformers.modeling_utils import no_init_weights
    return no_init_weights()


def hf_strategy(model: Decoder) -> Strategy:
    """Left-padded batches in arrival order; the final hidden state at the last position of each."""
    hf = hf_model(model)

    @torch.inference_mode()
    def hf_padded(scheduler: PassScheduler, runner: ModelRunner, requests: Sequence[Request],
                  stats: Stats) -> list[torch.Tensor]:
        hidden: list[torch.Tensor] = []
        device = runner.device
        stats.planned_tokens += sum(len(r) for r in requests)
        for batch in pack([len(r) for r in requests], runner.token_budget):
            seqs = [requests[i].ids() for i in batch]
            width = max(len(s) for s in seqs)
            ids = torch.zeros((len(seqs), width), dtype=torch.long)
            mask = torch.zeros((len(seqs), width), dtype=torch.long)
            for b, seq in enumerate(seqs):
                ids[b, width - len(seq):] = torch.from_numpy(seq.astype(np.int64))
                mask[b, width - len(seq):] = 1
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out = hf.model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device))
            hidden.extend(out.last_hidden_state[:, -1])
            stats.forward_passes += 1
            stats.fresh_tokens += sum(len(s) for s in seqs)
            stats.padded_tokens += len(seqs) * width - sum(len(s) for s in seqs)
            stats.attention_pairs += sum(causal_pairs(len(s)) for s in seqs)
        return hidden

    hf_padded.__name__ = "hf"
    return hf_padded
