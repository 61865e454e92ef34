"""The model runner: packed prefill batches, each row after its own resident KV."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .attention import Rows
from .kv import KV
from .model import Decoder
from .requests import LabelSet
from .stats import Stats, causal_pairs


@dataclass
class Row:
    """New tokens to compute after `past` (None: from position 0); keep_kv returns their KV."""

    ids: np.ndarray
    past: KV | None = None
    keep_kv: bool = False


PAD_FACTOR = 2  # attention pads a pass's rows to its longest row: rows × longest ≤ PAD_FACTOR × budget


def fits(tokens: int, rows: int, width: int, budget: int) -> bool:
    """Whether a pass of `rows` rows, `tokens` new tokens in all, the longest `width`, fits the budget."""
    return tokens <= budget and rows * width <= PAD_FACTOR * budget


def pack(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive index runs that fit the budget (one row at least).

    The linear layers see packed tokens only; attention pads each row to the
    longest of its pass, a waste `fits` bounds.
    """
    batches: list[list[int]] = []
    tokens = width = 0
    for i, length in enumerate(lengths):
        if batches and fits(tokens + length, len(batches[-1]) + 1, max(width, length), budget):
            batches[-1].append(i)
            tokens, width = tokens + length, max(width, length)
        else:
            batches.append([i])
            tokens = width = length
    return batches


class ModelRunner:
    """Runs forward passes of a decoder over packed rows and the head cut to label tokens."""

    def __init__(self, model: Decoder, token_budget: int = 4096) -> None:
        self.model = model
        self.token_budget = token_budget
        self.device = next(model.parameters()).device

    def _inputs(self, rows: list[Row], layout: Rows, resident: list[int]) -> tuple[torch.Tensor, ...]:
        """Packed token ids, their positions (after each row's resident KV), each row's last index."""
        starts = np.array(layout.starts)
        ids = np.concatenate([r.ids for r in rows]).astype(np.int64)
        positions = np.arange(starts[-1]) - np.repeat(starts[:-1] - np.array(resident), layout.lengths)
        host = torch.from_numpy(np.stack([ids, positions]))
        if self.device.type == "cuda":
            host = host.pin_memory()
        ids_t, positions_t = host.to(self.device, non_blocking=True)
        return ids_t, positions_t, torch.from_numpy(starts[1:] - 1).to(self.device, non_blocking=True)

    @torch.inference_mode()
    def forward(self, rows: list[Row], stats: Stats) -> tuple[torch.Tensor, list[KV | None]]:
        """Last hidden state of each row, and the KV of rows that asked to keep it."""
        lengths = [len(r.ids) for r in rows]
        resident = [len(r.past) if r.past is not None else 0 for r in rows]
        layout = Rows.build(lengths, [r.past for r in rows], self.device)
        ids, positions, last = self._inputs(rows, layout, resident)
        keep = any(r.keep_kv for r in rows)
        hidden, keys, values = self.model(ids, positions, layout, last, keep)
        kept: list[KV | None] = []
        for b, row in enumerate(rows):
            a, e = layout.starts[b], layout.starts[b + 1]
            kept.append(KV([k[a:e].clone() for k in keys], [v[a:e].clone() for v in values]) if row.keep_kv else None)
        stats.forward_passes += 1
        stats.fresh_tokens += sum(lengths)
        stats.attention_pairs += sum(causal_pairs(q, c) for q, c in zip(lengths, resident))
        stats.kv_read += sum(resident)
        stats.kv_written += sum(q for q, r in zip(lengths, rows) if r.keep_kv)
        return hidden, kept

    @torch.inference_mode()
    def answer_logprobs(self, hidden: torch.Tensor, labels: LabelSet) -> np.ndarray:
        """(rows, answers) log-probabilities, renormalised over the label tokens."""
        logits = self.model.label_logits(hidden, torch.tensor(labels.token_ids, device=hidden.device))
        logp = torch.log_softmax(logits, dim=-1)
        groups = torch.tensor(labels.groups, device=hidden.device)
        answers = [torch.logsumexp(logp[:, groups == g], dim=-1) for g in range(len(labels.names))]
        return torch.stack(answers, dim=-1).cpu().numpy()
