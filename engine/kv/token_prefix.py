"""The longest common prefix of two token arrays (numpy only: the scheduler and planner import it without torch)."""

from __future__ import annotations

import numpy as np


def common_length(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n
