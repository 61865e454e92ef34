"""Attention of packed rows: causal over each row's own tokens, merged by log-sum-exp with resident KV.

Kernels, as measured on the H200 (bench/results/2026-11-29-h200-attention-probe.json,
64 rows of 200-400 tokens, 32/8 heads, d=128, bf16):
- own tokens: cuDNN over right-padded rows 0.36 ms, flash varlen (no padding)
  0.58 ms, flash padded 0.91 ms. cuDNN pays for its padding, so rows are padded
  for attention only (the linear layers never see padding). But cuDNN builds
  a plan per new shape (43-61 ms the first call), so a query's first passes pay
  for every new bucket shape; `padded=False` runs own tokens as one flash
  varlen call instead (no padding, no plans).
- resident KV (5,000 query tokens over a 2,500-token anchor, non-causal): cuDNN
  0.36 ms (575 TFLOP/s), flash 0.61 ms. One call per resident run serves every
  row that continues it; the run is never copied per row.
cuDNN takes bf16/fp16 only: fp32 (the CPU, and the GPU reference) runs the same
algorithm in plain torch, exact to float round-off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .kv import KV


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

    cuDNN builds an execution plan for each new shape (tens of ms on the H200),
    so the buckets it runs (width > SMALL) are rounded up to one of 8 sizes per
    octave in each dimension: at most 1/8 of the power of two above, in rows and
    in width. Exact: pad rows and columns are zeros after each row's own tokens,
    which causal attention never reads.
    """
    if width <= SMALL:
        return rows, width
    return _step_up(rows, 1), _step_up(width, 16)


def _on(device: torch.device, array: np.ndarray) -> torch.Tensor:
    """A host array on the device without waiting for the work queued there (pinned, non-blocking)."""
    host = torch.from_numpy(array)
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host


def _buckets(lengths: list[int], starts: np.ndarray, device: torch.device) -> tuple[list[tuple[int, int, int]], torch.Tensor]:
    """Each padding bucket's (offset, rows, width) in one flat buffer, and each packed token's place there."""
    members: dict[int, list[int]] = {}
    for b, n in enumerate(lengths):
        members.setdefault(width_class(n), []).append(b)
    buckets, base, offset = [], np.zeros(len(lengths), dtype=np.int64), 0
    for _, rows in sorted(members.items()):
        count, width = padded_shape(len(rows), max(lengths[b] for b in rows))
        base[rows] = offset + width * np.arange(len(rows))
        buckets.append((offset, count, width))
        offset += count * width
    within = np.arange(starts[-1]) - np.repeat(starts[:-1], lengths)
    return buckets, _on(device, np.repeat(base, lengths) + within)


@dataclass
class Packed:
    """Rows laid out for one flash varlen call (no padding), with short resident runs copied in.

    A run no longer than its rows' own tokens together (a preamble before
    documents) is cheaper to copy before each of its rows than to attend
    separately and merge: those rows' keys are [run, own tokens]. offsets and
    key_offsets: (rows + 1) cumulative query and key counts on the device,
    longest and longest_keys their largest steps, key_total the last;
    own_index: where the packed tokens' keys go in the key buffer (None: the
    buffer is the packed keys themselves); inlined: each copied run and how
    many rows it precedes; inline_index: where those copies go, in that order.
    """

    offsets: torch.Tensor
    key_offsets: torch.Tensor
    longest: int
    longest_keys: int
    key_total: int
    own_index: torch.Tensor | None = None
    inlined: list[tuple[KV, int]] = field(default_factory=list)
    inline_index: torch.Tensor | None = None

    def keys(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value buffers of the varlen call: each row's copied run (if any), then its own."""
        if self.own_index is None:
            return k, v
        runs = [(run.layer(layer), count) for run, count in self.inlined]  # a chained run's pieces joined once
        out = []
        for own, pick in ((k, 0), (v, 1)):
            buffer = own.new_empty(self.key_total, *own.shape[1:])
            buffer.index_copy_(0, self.own_index, own)
            copies = torch.cat([kv[pick].repeat(count, 1, 1) for kv, count in runs])
            out.append(buffer.index_copy_(0, self.inline_index, copies))
        return out[0], out[1]


def _packed(lengths: list[int], starts: np.ndarray, row_runs: list[tuple[int, int, KV]], device: torch.device
            ) -> tuple[Packed, list[tuple[int, int, KV]]]:
    """The varlen layout of the rows, and the runs (first row, end row, KV) left to attend separately."""
    lengths_a = np.asarray(lengths, dtype=np.int64)
    before = np.zeros(len(lengths), dtype=np.int64)
    inlined, kept = [], []
    for first, end, run in row_runs:
        if len(run) * (end - first) <= lengths_a[first:end].sum():
            before[first:end] = len(run)
            inlined.append((first, end, run))
        else:
            kept.append((first, end, run))
    key_offsets = np.concatenate([[0], np.cumsum(before + lengths_a)])
    packed = Packed(_on(device, starts.astype(np.int32)), _on(device, key_offsets.astype(np.int32)),
                    int(lengths_a.max()), int((before + lengths_a).max()), int(key_offsets[-1]))
    if inlined:
        own = np.repeat(key_offsets[:-1] + before - starts[:-1], lengths_a) + np.arange(starts[-1])
        copies = np.concatenate([key_offsets[b] + np.arange(len(run)) for first, end, run in inlined
                                 for b in range(first, end)])
        packed.own_index, packed.inline_index = _on(device, own), _on(device, copies)
        packed.inlined = [(run, end - first) for first, end, run in inlined]
    return packed, kept


@dataclass
class Rows:
    """Where each row's new tokens sit in the packed batch, and which resident KV they continue.

    starts: (rows + 1) offsets into the packed tokens. For attention, rows are
    padded per bucket (width_class), not to the pass's longest row: buckets
    holds (offset, rows, width) of each bucket's (rows × width) block in one
    flat padded buffer, and pad_index (tokens,) the flat position of each packed
    token there. runs: (first token, end token, KV) for each stretch of
    consecutive rows that continue one resident KV run attended separately;
    past_index: the packed tokens that continue such a run, in run order (None
    when no row does); run_offsets: (cumulative query tokens, cumulative keys)
    of those runs laid end to end, for a varlen kernel. Unpadded: no buckets;
    `packed` lays the rows out for one varlen call, short runs copied in.
    """

    lengths: list[int]
    starts: list[int]
    buckets: list[tuple[int, int, int]]
    pad_index: torch.Tensor | None
    runs: list[tuple[int, int, KV]]
    past_index: torch.Tensor | None = None
    run_offsets: tuple[torch.Tensor, torch.Tensor] | None = None
    packed: Packed | None = None

    @classmethod
    def build(cls, lengths: list[int], pasts: list[KV | None], device: torch.device, padded: bool = True) -> "Rows":
        """The layout of rows of `lengths` new tokens after `pasts`; padded: per bucket, else for one varlen call."""
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        row_runs: list[tuple[int, int, KV]] = []  # (first row, end row, KV) of consecutive rows after one run
        for b, past in enumerate(pasts):
            if past is None:
                continue
            if row_runs and row_runs[-1][2] is past and row_runs[-1][1] == b:
                row_runs[-1] = (row_runs[-1][0], b + 1, past)
            else:
                row_runs.append((b, b + 1, past))
        buckets, pad_index, packed = [], None, None
        if padded:
            buckets, pad_index = _buckets(lengths, starts, device)
        else:
            packed, row_runs = _packed(lengths, starts, row_runs, device)
        runs = [(int(starts[first]), int(starts[end]), run) for first, end, run in row_runs]
        starts_list = starts.tolist()
        if not runs:
            return cls(lengths, starts_list, buckets, pad_index, runs, packed=packed)
        past_index = _on(device, np.concatenate([np.arange(a, e) for a, e, _ in runs]))
        sizes = np.array([[0, 0]] + [[e - a, len(run)] for a, e, run in runs], dtype=np.int32).cumsum(0, dtype=np.int32)
        run_offsets = (_on(device, sizes[:, 0].copy()), _on(device, sizes[:, 1].copy()))
        return cls(lengths, starts_list, buckets, pad_index, runs, past_index, run_offsets, packed)

    def pad(self, x: torch.Tensor) -> list[torch.Tensor]:
        """(tokens, heads, d) packed → per bucket (rows, heads, width, d), right-padded with zeros."""
        offset, rows, width = self.buckets[-1]
        out = x.new_zeros(offset + rows * width, *x.shape[1:])
        out.index_copy_(0, self.pad_index, x)
        return [out[o : o + r * w].view(r, w, *x.shape[1:]).transpose(1, 2) for o, r, w in self.buckets]

    def unpad(self, blocks: list[torch.Tensor]) -> torch.Tensor:
        """Per bucket (rows, heads, width, ...) → (tokens, heads, ...)."""
        flat = [x.transpose(1, 2).reshape(-1, *x.shape[1:2], *x.shape[3:]) for x in blocks]
        return (flat[0] if len(flat) == 1 else torch.cat(flat)).index_select(0, self.pad_index)


def _fused(q: torch.Tensor) -> bool:
    return q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)


def _matmuls(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention as two matmuls in the inputs' dtype, softmax and log-sum-exp in fp32.

    q (b, h, n, d), k/v (b, h_kv, m, d): the q heads of one kv head are stacked
    (h = h_kv · group, head i reads kv head i // group), so k and v are never
    repeated. Causal: bottom-right aligned (query i sees keys up to m − n + i).
    """
    b, h, n, d = q.shape
    kv_heads, m = k.shape[1], k.shape[2]
    group = h // kv_heads
    scores = (q.reshape(b, kv_heads, group * n, d) @ k.transpose(-1, -2)).float() * d ** -0.5
    if causal:
        allowed = torch.ones(n, m, dtype=torch.bool, device=q.device).tril(m - n).repeat(group, 1)
        scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, -1, keepdim=True)
    out = torch.exp(scores - lse).to(v.dtype) @ v
    return out.view(b, h, n, d), lse.view(b, h, n)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output (b, h, n, d) and log-sum-exp (b, h, n) in fp32; k/v may have fewer heads (GQA).

    cuDNN for bf16/fp16 on CUDA, unless every row is short; else two matmuls
    (fp32: the reference, exact to round-off).
    """
    if not _fused(q) or max(q.shape[2], k.shape[2]) <= SMALL:
        return _matmuls(q, k, v, causal)
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False, scale=q.shape[-1] ** -0.5)[:2]
    return out, lse.view(q.shape[:3])


def own_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: Packed, layer: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's causal attention to its own tokens (after its copied run, if any), all rows in one
    flash varlen call: (n, h, d), (n, h). Causal masks align bottom-right: token i of a row after a
    copied run of p sees keys up to p + i."""
    keys, values = packed.keys(k, v, layer)
    out, lse = torch.ops.aten._flash_attention_forward(
        q, keys, values, packed.offsets, packed.key_offsets, packed.longest, packed.longest_keys, 0.0, True,
        False, scale=q.shape[-1] ** -0.5)[:2]
    return out, lse.transpose(0, 1)


def over_runs(q: torch.Tensor, rows: Rows, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of the tokens in rows.past_index to their runs' keys (non-causal): (n, h, d), (n, h).

    One run of padded rows: one cuDNN call. Several, or unpadded rows: one flash
    varlen call over the runs' keys laid end to end. fp32: the reference, run by run.
    """
    def packed(t: torch.Tensor) -> torch.Tensor:  # (n, h, d) → (1, h, n, d) view
        return t.transpose(0, 1)[None]

    if not _fused(q) or (len(rows.runs) == 1 and rows.packed is None):
        outs, lses = [], []
        for first, end, run in rows.runs:
            keys, values = run.layer(layer)
            out, lse = attend(packed(q[first:end]), packed(keys), packed(values), causal=False)
            outs.append(out[0].transpose(0, 1))
            lses.append(lse[0].transpose(0, 1))
        return torch.cat(outs), torch.cat(lses)
    pieces = [piece for *_, run in rows.runs for piece in run.chunks()]
    keys = torch.cat([piece.keys[layer] for piece in pieces])
    values = torch.cat([piece.values[layer] for piece in pieces])
    cu_q, cu_k = rows.run_offsets
    out, lse = torch.ops.aten._flash_attention_forward(
        q.index_select(0, rows.past_index), keys, values, cu_q, cu_k, max(e - a for a, e, _ in rows.runs),
        max(len(run) for *_, run in rows.runs), 0.0, False, False, scale=q.shape[-1] ** -0.5)[:2]
    return out, lse.transpose(0, 1)


def merge(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor) -> torch.Tensor:
    """Two partial attentions over disjoint key sets as one: o (n, h, d), lse (n, h)."""
    lse = torch.logaddexp(lse1, lse2)
    return ((torch.exp(lse1 - lse)[..., None] * o1.float() + torch.exp(lse2 - lse)[..., None] * o2.float())
            .to(o1.dtype))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: Rows, layer: int,
              merger: Callable[..., torch.Tensor] = merge) -> torch.Tensor:
    """Packed q (tokens, heads, d) and k/v (tokens, kv_heads, d) → output (tokens, heads, d).

    Each row attends causally to its own tokens (one kernel call per padding
    bucket, or one varlen call for them all) and, where it continues a resident run, to all of that run's keys
    in `layer`; `merger` is `merge` or a compiled (fused) version of it.
    """
    if rows.packed is not None:
        out, lse = own_varlen(q, k, v, rows.packed, layer)
        if not rows.runs:
            return out
    else:
        blocks = zip(rows.pad(q), rows.pad(k), rows.pad(v))
        if not rows.runs and not _fused(q):
            return rows.unpad([F.scaled_dot_product_attention(*b, is_causal=True, enable_gqa=True) for b in blocks])
        own = [attend(*b, causal=True) for b in blocks]
        out = rows.unpad([o for o, _ in own])
        if not rows.runs:
            return out
        lse = rows.unpad([l[..., None] for _, l in own])[..., 0]
    index = rows.past_index
    lse = lse.index_select(0, index)
    past, past_lse = over_runs(q, rows, layer)
    return out.index_copy_(0, index, merger(out.index_select(0, index), lse, past, past_lse))
