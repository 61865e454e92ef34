"""Attention's padding buckets: rows padded to their bucket's width, bucket shapes rounded to few sizes."""

from __future__ import annotations

SMALL = 64  # rows and runs at most this long: attention by two matmuls (kernels tile 64+ queries per row)


def width_class(length: int) -> int:
    """The padding bucket of a row: the power of two at or above its length (at least SMALL)."""
    return max(SMALL, 1 << (length - 1).bit_length())


def _step_up(n: int, least: int) -> int:
    """n rounded up to a multiple of max(least, an eighth of the power of two at or above n)."""
    step = max(least, (1 << (n - 1).bit_length()) // 8)
    return -(-n // step) * step


def padded_shape(rows: int, width: int) -> tuple[int, int]:
    """A bucket's (rows, width) as attention runs it.

    cuDNN builds an execution plan for each new shape (tens of milliseconds),
    so the buckets it runs (width > SMALL) are rounded up to one of 8 sizes per
    octave in each dimension: at most 1/8 of the power of two above, in rows and
    in width. Exact: pad rows and columns are zeros after each row's own tokens,
    which causal attention never reads.
    """
    if width <= SMALL:
        return rows, width
    return _step_up(rows, 1), _step_up(width, 16)
