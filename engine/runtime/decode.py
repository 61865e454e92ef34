"""Greedy decoding on the device's scheduler: prompts prefilled by the quail strategy, then a token a pass.

`greedy` prefills the prompts as the `tree` strategy computes any requests
(each shared prefix once, whichever query computed it, its passes shared with
the other queries on the device), reads each prompt's KV back from the
resident tree, then drives a `DecodeJob`: every pass carries one new token of
each running sequence, after that sequence's KV in the pool, beside the rows
of other queries. A sequence ends at a stop token (not returned) or after
`max_tokens` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from quail.engine.runtime.counters import Stats
from quail.engine.runtime.requests import Request
from quail.engine.runtime.scheduler import Row, Share, tree

if TYPE_CHECKING:
    from quail.engine.kv.runs import KV
    from quail.engine.runtime.model_runner import ModelRunner


@dataclass(eq=False)
class _Sequence:
    """One prompt being continued: the KV of its tokens so far, the tokens to compute next (what the tree
    no longer held of the prompt, then the last generated token), and what it generated."""

    run: KV | None
    feed: np.ndarray
    tokens: list[int] = field(default_factory=list)
    ended: bool = False


def greedy(runner: ModelRunner, requests: Sequence[Request], max_tokens: int, stop: frozenset[int],
           stats: Stats) -> list[list[int]]:
    """The tokens greedy decoding gives after each request's prompt (the runner's resident tree holds them
    between prefill and decode)."""
    if not requests or max_tokens <= 0:
        return [[] for _ in requests]
    hidden = tree(runner, requests, stats)
    sequences = []
    for request, token in zip(requests, next_tokens(runner, torch.stack(hidden))):
        ids = request.ids()
        match = runner.tree.match(ids, counted=False) if runner.tree is not None else None
        run, length = (match.kv, match.length) if match is not None else (None, 0)
        tokens = [] if token in stop else [token]
        stats.generated_tokens += len(tokens)
        sequences.append(_Sequence(run, np.append(ids[length:], token).astype(np.int32), tokens,
                                   token in stop or len(tokens) >= max_tokens))
    job = DecodeJob(runner, sequences, max_tokens, stop, stats)
    runner.scheduler.run(job)
    return [s.tokens for s in sequences]


def next_tokens(runner: ModelRunner, hidden: torch.Tensor) -> list[int]:
    """The greedy token after each final hidden state: the full head, in fp32, its first largest logit."""
    logits = hidden.float() @ runner.model.head_weight().float().T
    return logits.argmax(dim=-1).tolist()


class DecodeJob:
    """Sequences continued a token a pass (the scheduler's Job): each pass takes every running sequence's
    next tokens (one, or the rest of a prompt the tree let go of, in parts of at most a pass) while the
    share admits them; after it, each sequence's run grows by what the pass kept and, where its feed
    ended, the next token is chosen."""

    def __init__(self, runner: ModelRunner, sequences: list[_Sequence], max_tokens: int, stop: frozenset[int],
                 stats: Stats) -> None:
        self.runner, self.sequences, self.max_tokens, self.stop, self.stats = runner, sequences, max_tokens, stop, stats
        self.members: list[tuple[_Sequence, int]] = []  # this pass's sequences and how many of their feed
        self.start = 0  # the sequence that leads the next pass (in turn: none waits behind the same others)

    def done(self) -> bool:
        return not self.members and all(s.ended for s in self.sequences)

    def fill(self, fill: Share) -> None:
        taken, before = {id(s) for s, _ in self.members}, len(self.members)
        order = self.sequences[self.start:] + self.sequences[:self.start]
        for sequence in order:
            if sequence.ended or id(sequence) in taken:
                continue
            length = min(len(sequence.feed), self.runner.token_budget)
            if not fill.admits(length):
                break
            fill.add(length)
            self.members.append((sequence, length))
        self.start = (self.start + len(self.members) - before) % len(self.sequences)

    def rows(self, base: int) -> list[Row]:
        return [Row(s.feed[:n], s.run, keep=n) for s, n in self.members]

    def take(self, last: torch.Tensor, kept: list[KV | None]) -> None:
        finished = []
        for j, ((sequence, n), new) in enumerate(zip(self.members, kept)):
            sequence.run = new if sequence.run is None else sequence.run.then(new)
            sequence.feed = sequence.feed[n:]
            if not len(sequence.feed):
                finished.append(j)
        members, self.members = self.members, []
        if not finished:
            return
        for j, token in zip(finished, next_tokens(self.runner, last[finished])):
            sequence = members[j][0]
            if token in self.stop:
                sequence.ended = True
                continue
            sequence.tokens.append(token)
            self.stats.generated_tokens += 1
            sequence.feed = np.array([token], dtype=np.int32)
            sequence.ended = len(sequence.tokens) >= self.max_tokens
        for sequence, _ in members:
            if sequence.ended:
                sequence.run = None  # its KV goes as soon as nothing else holds it
