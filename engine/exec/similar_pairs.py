"""Pairs of embeddings found by blocked matrix products: those above a cosine threshold, and each row's top k.

- The two sides come as unit rows of matrices (a row per distinct value, zeros for NULL or empty ones:
  embedding_functions.unit_rows) and go to the device in blocks of left rows, each block's cosines against
  every right row one matrix product (float64 on CUDA, float32 on the CPU), thresholds and top k taken
  there too, so a 10,000 x 10,000 join is a few GEMMs and only the pairs found come back, not 10^8 cosines.
- `above`: the pairs whose cosine exceeds `low` (a similarity join's condition, a margin below its threshold).
- `top`: for each left row, the right rows that can be among its k most similar when each right value
  stands for `counts` rows (ties at the k-th cosine, a margin below, all kept): a superset of any
  top-k per row (ROW_NUMBER or RANK <= k), the exact order left to SQL; a right row without an embedding is
  always kept (NULLs may sort first), and a left row without one, or with fewer than k right rows that have
  one, keeps every right row.
- Indices are positions in the inputs; pairs come sorted by (left, right).
- `stop` is called before each block (the query's check: it raises once the query is cancelled or past its
  time limit), so a long join stops within one block's product.
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import torch

BLOCK_BYTES = 256 << 20  # the cosines of one block of left rows against every right row
MARGIN = 1e-5  # below the k-th cosine: ties of the exact float64 order kept


def go_on() -> None:
    """A `stop` that never stops."""


def above(left: np.ndarray, right: np.ndarray, low: float, device: str = "cpu",
          stop: Callable[[], None] = go_on) -> tuple[np.ndarray, np.ndarray]:
    """The (left, right) index pairs of unit rows whose cosine exceeds `low`.

    >>> import pyarrow as pa; from quail.engine.exec.embedding_functions import raw_rows, unit_rows
    >>> l, _ = unit_rows(raw_rows(pa.array([[1.0, 0.0], [0.0, 1.0]])))
    >>> r, _ = unit_rows(raw_rows(pa.array([[1.0, 0.1], [0.0, 1.0], [1.0, 1.0]])))
    >>> [a.tolist() for a in above(l, r, 0.7)]
    [[0, 0, 1, 1], [0, 2, 1, 2]]
    """
    return _joined([(start, torch.nonzero(block > low)) for start, block in _blocks(left, right, device, stop)])


def top(left: np.ndarray, left_valid: np.ndarray, right: np.ndarray, right_valid: np.ndarray,
        counts: np.ndarray, k: int, device: str = "cpu", stop: Callable[[], None] = go_on
        ) -> tuple[np.ndarray, np.ndarray]:
    """The (left, right) index pairs that can be among each left row's k most similar rows, each right value
    standing for `counts` rows (see the module's summary).

    >>> import pyarrow as pa; from quail.engine.exec.embedding_functions import raw_rows, unit_rows
    >>> l, lv = unit_rows(raw_rows(pa.array([[1.0, 0.0], None])))
    >>> r, rv = unit_rows(raw_rows(pa.array([[1.0, 0], [1.0, 0], [0, 1.0], []])))
    >>> [a.tolist() for a in top(l, lv, r, rv, np.array([1, 1, 5, 1]), 1)]
    [[0, 0, 0, 1, 1, 1, 1], [0, 1, 3, 0, 1, 2, 3]]
    >>> [a.tolist() for a in top(l, lv, r, rv, np.array([1, 1, 5, 1]), 3)]
    [[0, 0, 0, 0, 1, 1, 1, 1], [0, 1, 2, 3, 0, 1, 2, 3]]
    """
    found = []
    no_vector = torch.from_numpy(~right_valid).to(device)
    weights = torch.from_numpy(np.array(counts, dtype=np.int64)).to(device)
    for start, block in _blocks(left, right, device, stop):
        block[:, no_vector] = -torch.inf
        kept = torch.ones(block.shape, dtype=torch.bool, device=block.device)  # undecided rows keep every right row
        if len(right):
            values, firsts = torch.topk(block, min(k, len(right)), dim=1)
            reached = torch.cumsum(weights[firsts], dim=1) >= k
            kth = torch.gather(values, 1, reached.int().argmax(dim=1, keepdim=True))
            decided = reached[:, -1] & torch.isfinite(kth[:, 0]) & torch.from_numpy(
                left_valid[start:start + len(block)]).to(block.device)
            kept[decided] = block[decided] >= kth[decided] - MARGIN
            kept[:, no_vector] = True  # no cosine: where SQL puts NULLs first, these lead
        found.append((start, torch.nonzero(kept)))
    return _joined(found)


def _blocks(left: np.ndarray, right: np.ndarray, device: str, stop: Callable[[], None]
            ) -> Iterator[tuple[int, torch.Tensor]]:
    """(first row, cosines of a block of left rows against every right row) for each block, on the device:
    float64 on CUDA, float32 on the CPU; `stop` called before each."""
    dtype = torch.float64 if torch.device(device).type == "cuda" else torch.float32
    rows = max(1, BLOCK_BYTES // (dtype.itemsize * max(len(right), 1)))
    other = torch.from_numpy(right).to(device, dtype).T
    for start in range(0, len(left), rows):
        stop()
        yield start, torch.from_numpy(left[start:start + rows]).to(device, dtype) @ other


def _joined(found: list[tuple[int, torch.Tensor]]) -> tuple[np.ndarray, np.ndarray]:
    """The blocks' (row, column) indices, rows offset by each block's first: sorted by (left, right)."""
    if not found:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pairs = np.concatenate([indices.cpu().numpy() + [start, 0] for start, indices in found]).astype(np.int64)
    return pairs[:, 0], pairs[:, 1]
