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


def pack(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive index runs whose padded size (rows × longest row) fits the budget (one row at least)."""
    batches: list[list[int]] = []
    width = 0
    for i, length in enumerate(lengths):
        width_if_added = max(width, length)
        if batches and (len(batches[-1]) + 1) * width_if_added <= budget:
            batches[-1].append(i)
            width = width_if_added
        else:
            batches.append([i])
            width = length
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
        first = pasts[0]
        if all(p is first for p in pasts):
            return Past([k[None] for k in first.keys], [v[None] for v in first.values], lengths)
        width = int(lengths.max())
        template = next(p for p in pasts if p is not None)
        keys, values = [], []
        for layer in range(len(template.keys)):
            heads, _, dim = template.keys[layer].shape
            k = template.keys[layer].new_zeros(len(rows), heads, width, dim)
            v = template.values[layer].new_zeros(len(rows), heads, width, dim)
            for b, p in enumerate(pasts):
                if p is not None:
                    k[b, :, : len(p)] = p.keys[layer]
                    v[b, :, : len(p)] = p.values[layer]
            keys.append(k)
            values.append(v)
        return Past(keys, values, lengths)

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
