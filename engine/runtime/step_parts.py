"""How a step's rows are cut into parts handed to the runtime.

Rows are ordered by their anchor's text (rows that share a prefix share a part), then cut into a head of
about HEAD_PASSES passes (the device starts early) and the rest.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from quail.engine.kv.token_prefix import common_start
from quail.engine.runtime.estimates import CHARS_PER_TOKEN


def step_parts(texts: Sequence[tuple[str, ...]], token_budget: int) -> tuple[list[int], list[range]]:
    """The order in which a step's rows (each given by its prompt's texts, its anchor's first) go to the
    runtime, and the parts of that order: sorted by text, so rows that share a prefix share a part, then
    cut by `_parts` (a pass holding about `token_budget` × CHARS_PER_TOKEN characters)."""
    order = sorted(range(len(texts)), key=texts.__getitem__)
    shared = [0] + [common_start(texts[a][0], texts[b][0]) for a, b in zip(order, order[1:])]
    fresh = [ROW_CHARS + sum(map(len, texts[r])) - common for r, common in zip(order, shared)]
    return order, _parts(fresh, shared, token_budget * CHARS_PER_TOKEN)


HEAD_PASSES = 4  # a large step's first part, in forward passes of estimated fresh tokens
ROW_CHARS = 32  # a row's fresh characters besides its arguments' (the answer cue; a filter's question)


def _parts(fresh: Sequence[float], shared: Sequence[int], per_pass: float) -> list[range]:
    """The rows (their fresh characters given, `per_pass` to a forward pass) in one part, or, when they
    fill more than 3 × HEAD_PASSES passes, in two: a head of about HEAD_PASSES passes, then the rest. The
    head ends within half its size of that, before the row sharing the fewest characters with the row
    before it (`shared`), nearest the target among those. Each part ends in a pass that is rarely full,
    so a step is cut once: enough to start the device early and tokenize the rest beside it."""
    total = np.cumsum(fresh, dtype=np.float64)
    if not len(total) or total[-1] <= 3 * HEAD_PASSES * per_pass:
        return [range(len(total))] if len(total) else []
    low, target, high = np.searchsorted(total, np.array([0.5, 1.0, 1.5]) * HEAD_PASSES * per_pass) + 1
    cuts = range(max(int(low), 1), min(int(high), len(total) - 1) + 1)
    if not cuts:  # a few rows fill the passes: one part
        return [range(len(total))]
    end = min(cuts, key=lambda e: (shared[e], abs(e - target)))
    return [range(end), range(end, len(total))]
