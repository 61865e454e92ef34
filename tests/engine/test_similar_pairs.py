"""The similarity join's blocked matrix products against a brute force over every pair, blocks of a few rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from quail.engine.exec import similar_pairs
from quail.engine.exec.embedding_functions import raw_rows, unit_rows


@pytest.fixture
def sides(monkeypatch):
    """Two sides of clustered unit vectors (some rows NULL or empty), blocks of 7 left rows."""
    monkeypatch.setattr(similar_pairs, "BLOCK_BYTES", 7 * 4 * 40)
    rng = np.random.default_rng(3)
    centers = rng.normal(size=(4, 16))

    def side(rows: int) -> pa.Array:
        vectors = centers[rng.integers(0, 4, rows)] + 0.6 * rng.normal(size=(rows, 16))
        return pa.array([None if k % 9 == 4 else [] if k % 13 == 6 else v.tolist() for k, v in enumerate(vectors)])
    return unit_rows(raw_rows(side(30))), unit_rows(raw_rows(side(40)))


def test_pairs_above_a_threshold_are_every_pair_a_brute_force_finds(sides):
    (left, _), (right, _) = sides
    rows, cols = similar_pairs.above(left, right, 0.6)
    want = np.argwhere(left @ right.T > 0.6)
    assert len(want) and list(zip(rows, cols)) == [tuple(pair) for pair in want]


@pytest.mark.parametrize("k", [1, 3, 200])
def test_top_pairs_hold_each_row_s_k_best_and_nothing_that_cannot_rank(sides, k):
    """Each right row stands for 1-3 rows: a left row keeps the right rows whose cosine reaches its k-th best
    row's (counting those), and the rows without a vector; a left row without one, or with fewer than k rows
    to rank, keeps every right row."""
    (left, left_valid), (right, right_valid) = sides
    counts = np.random.default_rng(4).integers(1, 4, len(right))
    rows, cols = similar_pairs.top(left, left_valid, right, right_valid, counts, k)
    kept = {(int(i), int(j)) for i, j in zip(rows, cols)}
    cosines = left @ right.T
    for i in range(len(left)):
        ranked = sorted(np.flatnonzero(right_valid), key=lambda j: -cosines[i, j])
        expanded = [j for j in ranked for _ in range(counts[j])]
        if not left_valid[i] or len(expanded) < k:
            want = set(range(len(right)))
        else:
            kth = cosines[i, expanded[k - 1]]
            want = {j for j in range(len(right)) if not right_valid[j] or cosines[i, j] >= kth - 1e-9}
        assert {j for (row, j) in kept if row == i} == want, i
