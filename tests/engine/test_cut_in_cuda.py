"""How far the host queues a pass ahead of the device while work may cut into it (GPU only; else skipped)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("the device runs passes behind the host on CUDA only", allow_module_level=True)

from quail.engine.model.config import ModelConfig  # noqa: E402
from quail.engine.model.decoder import Decoder  # noqa: E402
from quail.engine.runtime.counters import Stats  # noqa: E402
from quail.engine.runtime.model_runner import ModelRunner, go_on  # noqa: E402
from quail.engine.runtime.packing import Row  # noqa: E402
from quail.engine.runtime.scheduler import PassScheduler, _CutIn, layers_ahead  # noqa: E402

CFG = ModelConfig("qwen3", vocab_size=512, hidden_size=512, num_layers=16, num_heads=8, num_kv_heads=2, head_dim=64,
                  intermediate_size=2048, rope_theta=1e6, rms_norm_eps=1e-6, qk_norm=True)


def test_while_work_may_cut_in_the_host_queues_a_long_pass_a_few_layers_ahead_the_pass_before_counted():
    """Two passes of 8,000 tokens (long: more than SHORT_PASS_TOKENS) that work may cut into, the mark of
    each early (a lead grown large): as the host leaves each layer, the device has started all but at most
    `layers_ahead` (six for 8,000 tokens of this small shape) of the layers queued, the first pass's counted
    while the second's first layers go; every layer's start is recorded; each pass gives the hidden states it
    gives without the cut-in."""
    torch.manual_seed(0)
    model = Decoder(CFG).to("cuda", torch.float32).eval()
    runner = ModelRunner(model, token_budget=8192)
    rng = np.random.default_rng(0)
    rows = [Row(rng.integers(0, CFG.vocab_size, 1000)) for _ in range(8)]
    mark = 2
    scheduler = PassScheduler(runner)
    want, _ = runner.forward_shared([(rows, Stats())])
    queued_ahead, passes = [], []
    for _ in range(2):
        events = runner.pass_events(mark)
        cut_in = _CutIn(scheduler, [], scheduler._bounded_came, 8000, events, passes[-1] if passes else None)
        passes.append(events)
        at = cut_in.at

        def watched(layer, aside, at=at):
            at(layer, aside)
            queued_ahead.append(sum(not event.query() for events in passes for event in events.layers))

        cut_in.at = watched
        hidden, _ = cut_in.through(runner.passing([(rows, Stats())], events, go_on))
        torch.testing.assert_close(hidden, want)
    assert [len(events.layers) for events in passes] == [CFG.num_layers] * 2
    assert len(queued_ahead) == 2 * CFG.num_layers
    assert max(queued_ahead) <= layers_ahead(8000, runner.layer_weights) == 6, queued_ahead
