"""What fits a forward pass: rows of new tokens, a token budget, and padded attention's area.

- `Row`: a pass's new tokens and what they continue (resident KV, an earlier row, pool slots).
- `Fill`: a pass being filled, within its token budget and PAD_FACTOR times it of padded area.
- `Share`: a pass as one query fills it; `pack`: consecutive rows cut into passes that fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from quail.engine.kernels.padding_buckets import padded_shape, width_class

if TYPE_CHECKING:
    import torch

    from quail.engine.kv.runs import KV


@dataclass
class Row:
    """New tokens of a pass, and what they continue.

    New tokens to compute after `past` (None: from position 0) and, where `parent` names one, after
    that earlier row of the same pass (whose past is this row's too); the KV of the first `keep` of them
    is returned (written into the pool). Or, with `slots` (and no past), after the tokens whose KV those
    slots of the runner's pool hold, in order: a decode step, which the runner runs as one when every
    row of the pass is one. With `fed` (tensor, index), the row's one token is that element of a tensor
    on the device (a token chosen after an earlier pass, not yet read by the host); `ids` holds a
    placeholder."""

    ids: np.ndarray
    past: KV | None = None
    keep: int = 0
    parent: int | None = None
    slots: np.ndarray | None = None
    fed: tuple[torch.Tensor, int] | None = None


PAD_FACTOR = 2  # attention pads each row to its bucket's longest: padded area ≤ PAD_FACTOR × budget


@dataclass
class Fill:
    """A forward pass being filled.

    New tokens, and each padding bucket's rows and longest row (padded:
    attention pads rows per bucket, so the padded area is bounded too)."""

    budget: int
    tokens: int = 0
    buckets: dict[int, tuple[int, int]] = field(default_factory=dict)
    padded: bool = True

    def _area(self, length: int) -> int:
        """The padded attention area with one more row of `length` tokens."""
        key = width_class(length)
        rows, width = self.buckets.get(key, (0, 0))
        others = sum(math.prod(padded_shape(r, w)) for k, (r, w) in self.buckets.items() if k != key)
        return others + math.prod(padded_shape(rows + 1, max(width, length)))

    def admits(self, length: int) -> bool:
        """Whether a row of `length` new tokens still fits (an empty pass takes any row)."""
        if not self.buckets:
            return True
        fits = self.tokens + length <= self.budget
        return fits and (not self.padded or self._area(length) <= PAD_FACTOR * self.budget)

    def add(self, length: int) -> None:
        key = width_class(length)
        rows, width = self.buckets.get(key, (0, 0))
        self.buckets[key] = (rows + 1, max(width, length))
        self.tokens += length


@dataclass
class Share:
    """A pass as one query fills it.

    What the pass admits, and this query's `tokens` in it, at most `limit`
    (None: no bound of its own). A query adds rows while its share admits them."""

    fill: Fill
    limit: int | None
    tokens: int = 0

    def admits(self, length: int) -> bool:
        return (self.limit is None or self.tokens < self.limit) and self.fill.admits(length)

    def add(self, length: int) -> None:
        self.fill.add(length)
        self.tokens += length


def pack(lengths: Sequence[int], budget: int, padded: bool = True) -> list[list[int]]:
    """Consecutive index runs that fit the budget (one row at least).

    The linear layers see packed tokens only; padded attention pads each row to
    the longest of its bucket, a waste `Fill` bounds.
    """
    batches: list[list[int]] = []
    fill = Fill(budget, padded=padded)
    for i, length in enumerate(lengths):
        if not batches or not fill.admits(length):
            batches.append([])
            fill = Fill(budget, padded=padded)
        batches[-1].append(i)
        fill.add(length)
    return batches
