"""The longest common prefix of two token arrays, or of two strings.

Numpy only: the scheduler and the planner import it without torch.
"""

from __future__ import annotations

import numpy as np


def common_length(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def common_start(a: str | bytes, b: str | bytes) -> int:
    """The length of the longest common prefix of two strings, or of two byte strings (slices compared: C speed,
    a few dozen of them; no array made, which costs more than that for short ones)."""
    if a == b:
        return len(a)
    longest = min(len(a), len(b))
    low, high = 0, 1  # a[:low] == b[:low]; high doubles until a[:high] differs
    while high <= longest and a[:high] == b[:high]:
        low, high = high, 2 * high
    high = min(high - 1, longest)
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low
