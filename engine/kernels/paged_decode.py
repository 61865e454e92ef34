"""Attention of decode steps: one new query per sequence over that sequence's keys in the pool, read through a slot table."""

from __future__ import annotations

import torch

try:
    from quail.engine.kernels import paged_decode_triton as decode_kernels  # Triton, with CUDA builds of torch
except ImportError:
    decode_kernels = None

KEYS_PER_GATHER = 1 << 25  # key and value elements `gathered` reads at once (128 MiB each in fp32)


def paged_decode(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, table: torch.Tensor,
                 lengths: torch.Tensor) -> torch.Tensor:
    """q (sequences, heads, d), one query each; keys and values: one layer of a pool (slots, kv_heads, d);
    table (sequences, width) int32: each sequence's slots in order, of which its first lengths[b] (≥ 1)
    are its keys (its own new token's last) → (sequences, heads, d). Triton on CUDA in bf16/fp16 (one
    program per sequence and kv head: the group's queries read each key once; the table's width only
    bounds it, so a captured graph serves any lengths); elsewhere `gathered`, whose table must be no wider
    than the longest length (it reads every column)."""
    if decode_kernels is not None and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        return decode_kernels.paged_decode(q, keys, values, table, lengths)
    return gathered(q, keys, values, table, lengths)[0]


def gathered(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, table: torch.Tensor,
             lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`paged_decode` as padded matmuls (the reference, and the path on the CPU): each sequence's keys
    gathered through its table row, the columns past its length scored −inf; also the natural-log
    log-sum-exp (sequences, heads). At most KEYS_PER_GATHER elements gathered at a time."""
    kv_heads, d = keys.shape[1:]
    width = table.shape[1]
    group = q.shape[1] // kv_heads
    step = max(1, KEYS_PER_GATHER // max(1, width * kv_heads * d))
    span = torch.arange(width, device=q.device)
    outs, lses = [], []
    for at in range(0, q.shape[0], step):
        valid = span < lengths[at:at + step, None]
        index = torch.where(valid, table[at:at + step], table[at:at + step, :1]).long()
        k, v = (t[index].transpose(1, 2) for t in (keys, values))  # (n, kv_heads, width, d)
        asked = q[at:at + step].view(-1, kv_heads, group, d)
        scores = (asked @ k.transpose(-1, -2)).float() * d ** -0.5
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        lse = torch.logsumexp(scores, -1, keepdim=True)
        outs.append((torch.exp(scores - lse).to(v.dtype) @ v).reshape(-1, q.shape[1], d))
        lses.append(lse.reshape(-1, q.shape[1]))
    return torch.cat(outs), torch.cat(lses)
