"""The model runner: packs requests into padded batches under a token budget and scores them."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .model import Decoder
from .requests import LabelSet, Request


class ModelRunner:
    """Runs prefill-only forward passes and returns per-answer log-probabilities.

    Requests are sorted by length and cut into batches whose padded size stays
    within `token_budget`; sorting bounds padding waste to the length spread
    inside one batch.
    """

    def __init__(self, model: Decoder, token_budget: int = 4096) -> None:
        self.model = model
        self.token_budget = token_budget
        self.device = next(model.parameters()).device

    def score(self, requests: Sequence[Request]) -> list[np.ndarray]:
        """Log-probabilities of each request's answers, renormalised over its label tokens."""
        out: list[np.ndarray] = [np.empty(0)] * len(requests)
        by_labels: dict[LabelSet, list[int]] = {}
        for i, request in enumerate(requests):
            by_labels.setdefault(request.labels, []).append(i)
        for labels, members in by_labels.items():
            for batch in self._batches(members, [len(requests[i]) for i in members]):
                for i, row in zip(batch, self._score_batch([requests[i] for i in batch], labels)):
                    out[i] = row
        return out

    def _batches(self, members: list[int], lengths: list[int]) -> list[list[int]]:
        """Longest first; a batch grows while its padded size fits the token budget."""
        batches: list[list[int]] = []
        width = 0
        for length, i in sorted(zip(lengths, members), reverse=True):
            if batches and (len(batches[-1]) + 1) * width <= self.token_budget:
                batches[-1].append(i)
            else:
                batches.append([i])
                width = length
        return batches

    @torch.inference_mode()
    def _score_batch(self, requests: list[Request], labels: LabelSet) -> np.ndarray:
        seqs = [r.ids() for r in requests]
        lengths = torch.tensor([len(s) for s in seqs], device=self.device)
        ids = torch.zeros((len(seqs), int(lengths.max())), dtype=torch.long)
        for row, seq in enumerate(seqs):
            ids[row, : len(seq)] = torch.from_numpy(seq.astype(np.int64))
        label_ids = torch.tensor(labels.token_ids, device=self.device)
        logits = self.model.label_logits(ids.to(self.device), lengths, label_ids)
        logp = torch.log_softmax(logits.float(), dim=-1)
        groups = torch.tensor(labels.groups, device=self.device)
        answers = torch.stack(
            [torch.logsumexp(logp[:, groups == g], dim=-1) for g in range(len(labels.names))], dim=-1
        )
        return answers.cpu().numpy()
