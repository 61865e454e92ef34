"""Whole rows of a tensor copied or gathered by index as 8-byte words.

Torch's index kernels move those faster than 2-byte ones.
"""

from __future__ import annotations

import math

import torch


def copy_rows(out: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """`out.index_copy_(0, index, rows)`, bit for bit, returning `out`: rows made of whole 8-byte words are
    copied as int64 words (torch's index copy moves one element per lane; bench/GPU_NOTES.md has the
    figures), any others element by element."""
    words_out, words_rows = _words(out), _words(rows)
    if words_out is None or words_rows is None:
        return out.index_copy_(0, index, rows)
    words_out.index_copy_(0, index, words_rows)
    return out


def gather_rows(source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`source.index_select(0, index)`, bit for bit: rows made of whole 8-byte words gathered as int64 words."""
    words = _words(source)
    if words is None:
        return source.index_select(0, index)
    return words.index_select(0, index).view(source.dtype).view(len(index), *source.shape[1:])


def _words(t: torch.Tensor) -> torch.Tensor | None:
    """`t` as (rows, words) of int64 over the same memory; None when its rows are not whole aligned words."""
    size, width = t.element_size(), math.prod(t.shape[1:])
    if t.dim() == 0 or not t.is_contiguous() or (width * size) % 8 or (t.storage_offset() * size) % 8:
        return None
    return t.view(t.shape[0], width).view(torch.int64)  # the width given: a tensor of no rows has no -1 to infer
