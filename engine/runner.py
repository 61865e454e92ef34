"""The model runner: right-padded prefill batches, each row after its own resident KV."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .kv import KV
from .model import Decoder, Past
from .requests import LabelSet
from .stats import Stats, causal_pairs


@dataclass
class Row:
    """New tokens to compute after `past` (None: from position 0); keep_kv returns their KV."""

    ids: np.ndarray
    past: KV | None = None
    keep_kv: bool = False


KEYS_PER_TOKEN = 32  # attention keys a batch may materialize per layer, per token of budget


def pack(lengths: Sequence[int], budget: int, resident: Sequence[int] | None = None) -> list[list[int]]:
    """Consecutive index runs that fit the budget (one row at least).

    Padded new tokens (rows × longest row) stay within `budget`; with resident
    KV lengths given, the keys one layer materializes (rows × (longest past +
    longest row)) stay within KEYS_PER_TOKEN × budget.
    """
    resident = resident or [0] * len(lengths)
    batches: list[list[int]] = []
    width = past = 0
    for i, (length, behind) in enumerate(zip(lengths, resident)):
        grown_width, grown_past = max(width, length), max(past, behind)
        rows = len(batches[-1]) + 1 if batches else 1
        if batches and rows * grown_width <= budget and rows * (grown_past + grown_width) <= KEYS_PER_TOKEN * budget:
            batches[-1].append(i)
            width, past = grown_width, grown_past
        else:
            batches.append([i])
            width, past = length, behind
    return batches


class ModelRunner:
    """Runs forward passes of a decoder and the head cut to label tokens."""

    def __init__(self, model: Decoder, token_budget: int = 4096) -> None:
        self.model = model
        self.token_budget = token_budget
        self.device = next(model.parameters()).device

    def _past(self, rows: list[Row]) -> Past | None:
        pasts = [r.past for r in rows]
        if all(p is None for p in pasts):
            return None
        lengths = torch.tensor([len(p) if p is not None else 0 for p in pasts], device=self.device)
        shared = all(p is pasts[0] for p in pasts)
        return Past([pasts[0]] if shared else pasts, lengths)

    @torch.inference_mode()
    def forward(self, rows: list[Row], stats: Stats) -> tuple[torch.Tensor, list[KV | None]]:
        """Last hidden state of each row, and the KV of rows that asked to keep it."""
        lengths = [len(r.ids) for r in rows]
        width = max(lengths)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        for b, row in enumerate(rows):
            ids[b, : lengths[b]] = torch.from_numpy(row.ids.astype(np.int64))
        keep = any(r.keep_kv for r in rows)
        past = self._past(rows)
        hidden, keys, values = self.model(ids.to(self.device), torch.tensor(lengths, device=self.device), past, keep)
        kept: list[KV | None] = []
        for b, row in enumerate(rows):
            if row.keep_kv:
                kept.append(KV([k[b, :, : lengths[b]].clone() for k in keys],
                               [v[b, :, : lengths[b]].clone() for v in values]))
            else:
                kept.append(None)
        resident = [len(r.past) if r.past is not None else 0 for r in rows]
        stats.forward_passes += 1
        stats.fresh_tokens += sum(lengths)
        stats.padded_tokens += len(rows) * width - sum(lengths)
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
