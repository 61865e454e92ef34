"""Speed of light: the roofline time of a plan's minimal work on a device.

As bench/BENCHMARK.md (and the system we compare with) defines it: over the
whole query count fresh tokens, attention pairs, KV rows written and read; then
for the attention projections (P_A parameters) and the MLP (P_M) take
max(2·P·tokens / R_dense, P·bytes_per_weight·passes / BW) each, and for attention
max(4·n_q·d_head·L·pairs / R_attn, κ·(kv_written + kv_read) / BW) with
κ = 2·L·n_kv·d_head·bytes_per_kv; the sum is the SoL time. passes = ⌈tokens / C⌉
for C tokens per forward pass. Embeddings, head, norms and activations are left out.
Generation adds its decode steps to the passes (each reads the weights once) and
its fed-back tokens to the tokens, pairs and KV (decode.ideal), so a decode-bound
query's speed of light is the bandwidth roofline of its steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from quail.engine.model.config import ModelConfig
from quail.engine.runtime.counters import Stats

from quail.planner.join_order import Rank, Work, by_tokens


@dataclass(frozen=True)
class Device:
    """Peak rates: dense FLOP/s per precision, attention FLOP/s, memory bytes/s."""

    name: str
    dense: dict[str, float]
    attention: float
    bandwidth: float


DEVICES = {
    # Datasheet constants, as BENCHMARK.md fixes them (fp32: the datasheet's non-tensor 67 TFLOP/s).
    "h100-sxm": Device("NVIDIA H100 SXM", {"fp8": 1.979e15, "bf16": 0.9895e15, "fp32": 6.7e13}, 0.9895e15, 3.35e12),
    "h200": Device("NVIDIA H200", {"fp8": 1.979e15, "bf16": 0.9895e15, "fp32": 6.7e13}, 0.9895e15, 4.8e12),
    # Measured once on the 2-core CI machine: 2048² fp32 matmul 0.14 TFLOP/s; copy 41.5 GB/s (read + write).
    # Its bf16 and fp8 matmuls are no faster than fp32, so every precision gets the fp32 rate.
    "cpu": Device("CPU (2 cores)", {"fp32": 1.4e11, "bf16": 1.4e11, "fp8": 1.4e11}, 1.4e11, 4.15e10),
}
BYTES = {"fp8": 1, "bf16": 2, "fp32": 4}


def parameter_counts(model: ModelConfig) -> tuple[int, int]:
    """(P_A, P_M): attention projection and MLP parameters over all layers."""
    attention, mlp = model.layer_weights
    return model.num_layers * attention, model.num_layers * mlp


def sol_seconds(work: Stats, model: ModelConfig, device: Device, precision: str, tokens_per_pass: int,
                replicas: int = 1) -> float:
    """Roofline seconds of the given work (use the ideal plan's counts for the speed of light), spread evenly
    over `replicas` devices of this kind (each computes its share in its own passes)."""
    tokens = work.fresh_tokens
    prefill = tokens - work.decoded_tokens
    passes = (math.ceil(prefill / tokens_per_pass) if prefill > 0 else 0) + work.decode_steps
    rate = device.dense[precision]
    weight_bytes = BYTES[precision]
    linear = sum(max(2 * p * tokens / rate, p * weight_bytes * passes / device.bandwidth)
                 for p in parameter_counts(model))
    kv_bytes = 4 if precision == "fp32" else 2
    kappa = 2 * model.num_layers * model.num_kv_heads * model.head_dim * kv_bytes
    attention = max(4 * model.num_heads * model.head_dim * model.num_layers * work.attention_pairs / device.attention,
                    kappa * (work.kv_written + work.kv_read) / device.bandwidth)
    return (linear + attention) / replicas


def rank_by_sol(sol: Callable[[Stats], float | None] | None) -> Rank:
    """A join order's rank: the speed-of-light seconds of its work (tokens when there are no device constants).

    Anchor documents resident in the KV pool when planned are in that work only as the KV their partners read
    (join_order.Edge.anchor_resident: no fresh tokens, pairs or KV written), so an order over warm documents
    ranks cheaper.
    """
    if sol is None or sol(Stats()) is None:
        return by_tokens

    def rank(work: Work) -> float:
        return sol(Stats(fresh_tokens=work.tokens, attention_pairs=work.pairs, kv_written=work.kv_written,
                         kv_read=work.kv_read))

    return rank
