"""Small prefill passes through captured layer graphs against the same passes run directly (GPU only; else skipped)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("pass graphs run on CUDA", allow_module_level=True)

from quail.engine.kernels.pass_rows import Rows  # noqa: E402
from quail.engine.kernels.fp8 import to_fp8  # noqa: E402
from quail.engine.model.config import ModelConfig  # noqa: E402
from quail.engine.model.decoder import Decoder  # noqa: E402
from quail.engine.runtime.model_runner import ModelRunner  # noqa: E402
from quail.engine.runtime.pass_graphs import SIZES, PassGraphs  # noqa: E402

CFG = ModelConfig("qwen3", vocab_size=512, hidden_size=256, num_layers=3, num_heads=8, num_kv_heads=2, head_dim=32,
                  intermediate_size=512, rope_theta=1e6, rms_norm_eps=1e-6, qk_norm=True)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _pass(model: Decoder, lengths: list[int], parts, seed: int, inside=None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A pass of new rows of these lengths: each row's last hidden state, and every layer's keys and values;
    `inside(layer)` called from each layer's KV hook (another pass cut into this one)."""
    rng = np.random.default_rng(seed)
    ids = torch.from_numpy(rng.integers(0, CFG.vocab_size, sum(lengths))).cuda()
    positions = torch.from_numpy(np.concatenate([np.arange(n) for n in lengths])).cuda()
    layout = Rows.build(lengths, [None] * len(lengths), torch.device("cuda"), model.padded_attention,
                        [None] * len(lengths))
    last = torch.from_numpy(np.cumsum(lengths) - 1).cuda()
    kept: list[torch.Tensor] = []

    def keep(layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if inside is not None:
            inside(layer)
        kept.extend((k.clone(), v.clone()))

    with torch.inference_mode():
        hidden = model(ids, positions, layout, last, keep, parts)
    return hidden, kept


@pytest.mark.parametrize("dtype, bound, padded", [(torch.float32, 1e-5, True), (torch.bfloat16, 2e-2, True),
                                                  (torch.bfloat16, 2e-2, False)], ids=["fp32", "bf16", "bf16-packed"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_captured_pass_gives_the_direct_pass_hidden_states_and_kv(dtype, bound, padded, compiled):
    """Passes of 5, 137 (two rows), 2,048 (four), 4,050 (a full pass of a 4,096-token budget, of several
    queries' rows) and then 43 tokens (after the long ones: padding rows that held their values) through the
    graphs give what the layers give directly, rows padded for attention or packed (the Triton kernel
    writing its output into the graphs' buffer); a pass between the small sizes and a full one, past the
    budget, or full of one query's rows, has no graphs, nor has any before they are captured."""
    torch.manual_seed(0)
    model = Decoder(CFG).to("cuda", dtype).eval()
    model.padded_attention = padded
    assert PassGraphs.serves(model)
    if compiled:
        model.compile_layers()
    graphs = PassGraphs(model, token_budget=4096)
    assert graphs.parts(5) is None
    graphs.prepare()
    assert set(graphs.graphs) == {*SIZES, 4096}
    assert graphs.parts(4050) is None, "one query's full pass runs directly"
    for seed, lengths in enumerate(([5], [100, 37], [700, 300, 1000, 48], [3000, 1050], [40, 3])):
        parts = graphs.parts(sum(lengths), shared=True)
        assert parts is not None
        got, got_kv = _pass(model, lengths, parts, seed)
        want, want_kv = _pass(model, lengths, None, seed)
        assert _rel(got, want) < bound
        assert len(got_kv) == len(want_kv) == 2 * CFG.num_layers
        for a, b in zip(got_kv, want_kv):
            assert _rel(a, b) < bound
    assert all(graphs.parts(n, shared=True) is None for n in (SIZES[-1] + 1, 3000, 4097))
    assert set(PassGraphs(model, token_budget=2048).sizes) == set(SIZES), "no full size within the small ones"


def test_a_model_with_fp8_layers_runs_its_passes_directly():
    model = Decoder(CFG).to("cuda", torch.bfloat16).eval()
    to_fp8(model.layers)
    assert not PassGraphs.serves(model) and ModelRunner(model).passes is None


@pytest.mark.parametrize("inner_lengths", [[100, 37], [1500, 200, 300]], ids=["smaller-size", "same-size"])
def test_a_pass_cut_into_a_captured_pass_leaves_both_as_they_are_alone(inner_lengths):
    """A captured pass (2,048 tokens) with another captured pass run inside it at its second layer's KV
    hook, its buffers set aside (CapturedParts.aside): each gives the hidden states and KV it gives run
    directly alone, whether the inner pass uses a smaller size's graphs or the same size's (the same rows
    of the buffers)."""
    torch.manual_seed(0)
    model = Decoder(CFG).to("cuda", torch.float32).eval()
    graphs = PassGraphs(model, token_budget=4096)
    graphs.prepare()
    outer_lengths, got_inner = [700, 300, 1000, 48], []

    def inside(layer: int) -> None:
        if layer == 1:
            with outer.aside():
                got_inner.append(_pass(model, inner_lengths, graphs.parts(sum(inner_lengths), shared=True), 1))

    outer = graphs.parts(sum(outer_lengths), shared=True)
    got = _pass(model, outer_lengths, outer, 0, inside)
    for (hidden, kv), (want, want_kv) in zip([got, *got_inner], [_pass(model, outer_lengths, None, 0),
                                                                  _pass(model, inner_lengths, None, 1)]):
        assert _rel(hidden, want) < 1e-5
        assert len(kv) == len(want_kv) == 2 * CFG.num_layers
        for a, b in zip(kv, want_kv):
            assert _rel(a, b) < 1e-5
