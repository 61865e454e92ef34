"""The model runner: packed prefill batches, each row after its resident KV and earlier rows of its pass."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from quail.engine.kernels.attention import Rows
from quail.engine.kv.prefix_cache import PrefixCache
from quail.engine.kv.runs import KV, KVLedger
from quail.engine.model.decoder import Decoder
from quail.engine.runtime.counters import Stats, causal_pairs
from quail.engine.runtime.requests import LabelSet
from quail.engine.runtime.scheduler import PassScheduler, Row


def go_on() -> None:
    """No reason to stop."""


def _gathered(spans: list[tuple[int, int]], keys: list[torch.Tensor], values: list[torch.Tensor]) -> list[KV]:
    """KV of each (first packed token, tokens) span: one gather per layer, each span a view of it."""
    index = torch.from_numpy(np.concatenate([np.arange(first, first + n) for first, n in spans]))
    index = index.to(keys[0].device, non_blocking=True)
    kept_keys = [k.index_select(0, index) for k in keys]
    kept_values = [v.index_select(0, index) for v in values]
    out, offset = [], 0
    for _, n in spans:
        out.append(KV([k[offset : offset + n] for k in kept_keys], [v[offset : offset + n] for v in kept_values]))
        offset += n
    return out


def _kept(rows: list[Row], layout: Rows, keys: list[torch.Tensor], values: list[torch.Tensor],
          ledger: KVLedger) -> list[KV | None]:
    """The KV of each row that asked to keep it (all its tokens, or its first keep_tokens: those in a
    gather of their own, so a cache holding them holds nothing else of the pass)."""
    out: list[KV | None] = [None] * len(rows)
    whole = [b for b, row in enumerate(rows) if row.keep_kv]
    heads = [b for b, row in enumerate(rows) if not row.keep_kv and row.keep_tokens]
    if whole:
        row_bytes = sum(2 * k[0].nbytes for k in keys)
        for b, kv in zip(whole, _gathered([(layout.starts[b], layout.lengths[b]) for b in whole], keys, values)):
            out[b] = kv
            ledger.keep(kv, layout.lengths[b] * row_bytes)
    if heads:
        for b, kv in zip(heads, _gathered([(layout.starts[b], rows[b].keep_tokens) for b in heads], keys, values)):
            out[b] = kv
    return out


class ModelRunner:
    """Runs forward passes of a decoder over packed rows and the head cut to label tokens.

    Runners over one model share its `scheduler` (the device's owner loop, which runs every query's
    passes), KV `ledger` and prefix `cache` (kv/prefix_cache.py; None: none). `check` raises to stop a
    query before its next pass (see `for_query`).
    """

    def __init__(self, model: Decoder, token_budget: int = 4096, scheduler: PassScheduler | None = None,
                 check: Callable[[], None] = go_on, ledger: KVLedger | None = None,
                 cache: PrefixCache | None = None, retain: bool = False) -> None:
        self.model = model
        self.token_budget = token_budget
        self.device = next(model.parameters()).device
        self.scheduler = scheduler or PassScheduler(self)
        self.check = check
        self.ledger = ledger or KVLedger()
        self.cache = cache
        self.retain = retain

    def for_query(self, check: Callable[[], None], retain: bool = False) -> "ModelRunner":
        """This runner for one query: same model, budget, scheduler, KV ledger and prefix cache; `check`
        before each pass; `retain`: store the documents' KV it computes in the cache (the query's later
        AI steps may read them)."""
        return ModelRunner(self.model, self.token_budget, self.scheduler, check, self.ledger, self.cache, retain)

    def _inputs(self, rows: list[Row], layout: Rows) -> tuple[torch.Tensor, ...]:
        """Packed token ids, their positions (after what each row continues), each row's last index."""
        starts = np.array(layout.starts)
        ids = np.concatenate([r.ids for r in rows]).astype(np.int64)
        positions = np.arange(starts[-1]) - np.repeat(starts[:-1] - np.array(layout.context), layout.lengths)
        host = torch.from_numpy(np.stack([ids, positions]))
        if self.device.type == "cuda":
            host = host.pin_memory()
        ids_t, positions_t = host.to(self.device, non_blocking=True)
        return ids_t, positions_t, torch.from_numpy(starts[1:] - 1).to(self.device, non_blocking=True)

    def forward(self, rows: list[Row], stats: Stats) -> tuple[torch.Tensor, list[KV | None]]:
        """Last hidden state of each row, and the KV of rows that asked to keep it: one pass, now, on the
        caller's thread (the scheduler runs the queries' passes; this is for probes and tests)."""
        return self.forward_shared([(rows, stats)])

    @torch.inference_mode()
    def forward_shared(self, groups: Sequence[tuple[list[Row], Stats]]) -> tuple[torch.Tensor, list[KV | None]]:
        """One pass over the rows of several owners, in order (a row's parent is its index in the pass):
        each row's last hidden state and kept KV, each owner's work counted in its stats."""
        rows = [row for owned, _ in groups for row in owned]
        lengths = [len(r.ids) for r in rows]
        layout = Rows.build(lengths, [r.past for r in rows], self.device, self.model.padded_attention,
                            [r.parent for r in rows])
        ids, positions, last = self._inputs(rows, layout)
        keep = any(r.keep_kv or r.keep_tokens for r in rows)
        hidden, keys, values = self.model(ids, positions, layout, last, keep)
        kept = _kept(rows, layout, keys, values, self.ledger) if keep else [None] * len(rows)
        start = 0
        for owned, stats in groups:
            end = start + len(owned)
            _count(stats, lengths[start:end], layout.context[start:end], owned)
            start = end
        return hidden, kept

    @torch.inference_mode()
    def answer_logprobs(self, hidden: torch.Tensor, labels: LabelSet) -> torch.Tensor:
        """(rows, answers) log-probabilities, renormalised over the label tokens, on the device: computed
        without waiting for it (the label tokens and each answer's members copied without a sync, no
        boolean indexing), so a caller can go on queuing work."""
        members = np.array([[0.0 if group == answer else -np.inf for group in labels.groups]
                            for answer in range(len(labels.names))], dtype=np.float32)
        ids = torch.tensor(labels.token_ids).to(hidden.device, non_blocking=True)
        members_t = torch.from_numpy(members).to(hidden.device, non_blocking=True)
        logp = torch.log_softmax(self.model.label_logits(hidden, ids), dim=-1)
        return torch.logsumexp(logp[:, None, :] + members_t, dim=-1)


def _count(stats: Stats, lengths: list[int], context: list[int], rows: list[Row]) -> None:
    """An owner's rows of a pass in its counters (a pass it has no rows in does not count)."""
    if not rows:
        return
    stats.forward_passes += 1
    stats.fresh_tokens += sum(lengths)
    stats.attention_pairs += sum(causal_pairs(q, c) for q, c in zip(lengths, context))
    stats.kv_read += sum(context)
    stats.kv_written += sum(q for q, r in zip(lengths, rows) if r.keep_kv)
