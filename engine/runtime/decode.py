"""Decoding on the device's scheduler: prompts prefilled by the quail strategy, then a token a pass.

`generate` prefills the prompts as the `tree` strategy computes any requests
(each shared prefix once, whichever query computed it, its passes shared with
the other queries on the device), reads each prompt's KV back from the
resident tree, then drives a `DecodeJob`: every pass carries one new token of
each running sequence, after that sequence's KV in the pool, beside the rows
of other queries. Tokens are chosen on the device and fed to the next pass from
there; the host reads them a pass later (fed_tokens.py), so it fills each pass
while the device computes the one before. How a sequence is continued and
when it ends is a `Decoding`: greedy or sampled, and at most so many tokens, up
to a stop token or a stop text.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch

from quail.engine.errors import ResourceExhausted
from quail.engine.kv.pool import KVPool
from quail.engine.kv.runs import KV
from quail.engine.runtime.counters import Stats, causal_pairs
from quail.engine.runtime.fed_tokens import Chosen
from quail.engine.runtime.requests import Request
from quail.engine.runtime.packing import Row, Share
from quail.engine.runtime.scheduler import DECODE_PASS_TOKENS, PassScheduler
from quail.engine.runtime.tree_job import tree

if TYPE_CHECKING:
    from quail.engine.runtime.grammar import Schema
    from quail.engine.runtime.model_runner import ModelRunner

Text = Callable[[list[int]], str]  # token ids to text (the tokenizer's decode)


@dataclass(frozen=True)
class Decoding:
    """How sequences are continued, and when each ends.

    At most `max_tokens` tokens; a stop token (`stop_ids`: not returned) ends a
    sequence, as does a stop text (`stop_texts`) appearing in its text (the
    caller cuts the text before it: `cut`). `temperature` 0 takes the most
    probable token (greedy); above 0 a token is drawn from the softmax of the
    logits over the temperature, within the smallest set of tokens whose
    probability reaches `top_p` (nucleus sampling). A draw's randomness is a
    function of the prompt's tokens and the step, so a prompt gets the same
    text whatever else runs beside it, and the same text again. With a
    `schema` (grammar.py) each token is one the schema's grammar allows, and a
    sequence ends once its JSON value is complete.
    """

    max_tokens: int
    stop_ids: frozenset[int] = frozenset()
    stop_texts: tuple[str, ...] = ()
    temperature: float = 0.0
    top_p: float = 1.0
    schema: Schema | None = None
    window: int = field(init=False, repr=False, compare=False)  # how many last tokens hold any stop text

    def __post_init__(self) -> None:
        object.__setattr__(self, "window", max((len(s.encode()) for s in self.stop_texts), default=0) + 1)

    def stopped(self, tail: str) -> bool:
        """Whether the text of a sequence's last `window` tokens (a token is at least a byte) holds a stop text:
        each stop looked for once a token, in a tail of bounded length (linear in the tokens generated)."""
        return any(s in tail for s in self.stop_texts)

    def cut(self, text: str) -> str:
        """The text before its first stop text."""
        return text[:min((i for i in (text.find(s) for s in self.stop_texts) if i >= 0), default=len(text))]


@dataclass(eq=False)
class _Sequence:
    """One prompt being continued: its KV so far, the tokens to compute next (what the tree no longer
    held of the prompt, or the last chosen token: on the host in `feed`, or on the device in `fed`), what
    it generated (`tokens`, and `owed`: chosen, not yet read), and its sampling seed.

    Its KV lies in the runner's pool, in order, in `slots[:length]` (held by the runs in `held`: the
    prompt's, then each new token's), so a decode step reads it through that slot table and appending a
    token copies nothing; or, once part of it was kept elsewhere (a pass that found the pool full), it is
    the one run `spilled`.
    """

    pool: KVPool
    feed: np.ndarray
    seed: int
    matcher: Any = None  # where the schema's grammar stands (Decoding.schema), else None
    tokens: list[int] = field(default_factory=list)
    owed: int = 0
    fed: tuple[torch.Tensor, int] | None = None
    ended: bool = False
    held: list[KV] = field(default_factory=list)
    slots: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    length: int = 0
    spilled: KV | None = None

    def extend(self, run: KV | None) -> None:
        """The KV of the next tokens, after what it has."""
        if run is None:
            return
        if self.spilled is None and len(run.parts) == 1 and run.parts[0][0] is self.pool:
            added = run.parts[0][1]
            if self.length + len(added) > len(self.slots):
                self.slots = np.resize(self.slots, max(2 * len(self.slots), self.length + len(added) + 64))
            self.slots[self.length:self.length + len(added)] = added
            self.length += len(added)
            self.held.append(run)
            return
        before = self.spilled or (KV(((self.pool, self.slots[:self.length]),)) if self.length else None)
        self.spilled = run if before is None else before.then(run)
        self.held, self.slots, self.length = [], self.slots[:0], 0

    @property
    def waiting(self) -> int:
        """How many tokens it has to compute next."""
        return len(self.feed) if self.fed is None else 1

    def row(self, n: int) -> Row:
        """A row of its next `n` tokens, keeping their KV."""
        ids = self.feed[:n] if self.fed is None else _PLACEHOLDER
        if self.spilled is not None:
            return Row(ids, self.spilled, keep=n, fed=self.fed)
        return Row(ids, keep=n, slots=self.slots[:self.length], fed=self.fed)

    def computed(self, n: int, run: KV | None) -> bool:
        """Its next `n` tokens were computed, their KV `run`; whether it has none left to compute."""
        self.extend(run)
        if self.fed is None:
            self.feed = self.feed[n:]
        self.fed = None
        return not len(self.feed)

    def chose(self, tokens: torch.Tensor, index: int, decoding: Decoding) -> None:
        """A token was chosen after it, element `index` of `tokens` on the device: fed next unless it is
        the last `max_tokens` allows (after the rest of its prompt, if the tree let go of part of it: read
        at once, then); the host reads it later (`accept`)."""
        self.owed += 1
        if len(self.tokens) + self.owed >= decoding.max_tokens:
            return
        if len(self.feed):
            self.feed = np.append(self.feed, np.int32(tokens[index].item()))
        else:
            self.fed = (tokens, index)

    def accept(self, token: int, decoding: Decoding, text: Text, stats: Stats) -> None:
        """Take the token chosen after this sequence (read by the host): a stop token ends it (dropped);
        else the token is generated, and the sequence ends at its `max_tokens`-th token, once a stop text
        shows or once its schema's JSON value is complete. An ended sequence lets go of its KV (and of a
        token it was fed since: computed for nothing)."""
        self.owed -= 1
        if token in decoding.stop_ids:
            self._end()
            return
        self.tokens.append(token)
        stats.generated_tokens += 1
        complete = self.matcher is not None and decoding.schema.take(self.matcher, token)
        if complete or len(self.tokens) >= decoding.max_tokens or bool(decoding.stop_texts) and decoding.stopped(
                text(self.tokens[-decoding.window:])):
            self._end()

    def _end(self) -> None:
        self.ended = True
        self.held, self.spilled, self.fed = [], None, None  # its KV goes as soon as nothing else holds it


_PLACEHOLDER = np.zeros(1, dtype=np.int32)  # the ids of a row whose token is fed from the device


def generate(scheduler: PassScheduler, runner: ModelRunner, requests: Sequence[Request], decoding: Decoding,
             text: Text, stats: Stats) -> list[list[int]]:
    """The tokens decoding gives after each request's prompt (the runner's resident tree holds them
    between prefill and decode), the requests taken in waves (`waves`: the sequences decoding at once keep
    their KV in the pool); ResourceExhausted when a schema's JSON value is not complete within
    `max_tokens`."""
    if not requests or decoding.max_tokens <= 0:
        return [[] for _ in requests]
    room = runner.pool.slots // 2 if runner.pool.slots else None
    return [tokens for wave in waves([len(r) for r in requests], decoding.max_tokens, room)
            for tokens in _generated(scheduler, runner, [requests[i] for i in wave], decoding, text, stats)]


def waves(prompts: Sequence[int], max_tokens: int, room: int | None) -> list[range]:
    """Consecutive requests (by their prompts' lengths) whose prompts and answers together take at most
    `room` tokens of KV, at least one a wave; None: all at once. Half the pool is the room: the rest stays
    for the other queries and the prefixes kept for them.

    >>> waves([100, 100, 100, 500], 20, 300), waves([100, 100], 20, None)
    ([range(0, 2), range(2, 3), range(3, 4)], [range(0, 2)])
    """
    if room is None:
        return [range(len(prompts))]
    out, start, used = [], 0, 0
    for i, length in enumerate(prompts):
        if i > start and used + length + max_tokens > room:
            out.append(range(start, i))
            start, used = i, 0
        used += length + max_tokens
    return out + [range(start, len(prompts))]


def _generated(scheduler: PassScheduler, runner: ModelRunner, requests: Sequence[Request], decoding: Decoding,
               text: Text, stats: Stats) -> list[list[int]]:
    """`generate` for one wave."""
    hidden = tree(scheduler, runner, requests, stats)
    sequences = []
    for request in requests:
        ids = request.ids()
        match = runner.tree.match(ids, counted=False) if runner.tree is not None else None
        run, length = (match.kv, match.length) if match is not None else (None, 0)
        matcher = decoding.schema.matcher() if decoding.schema is not None else None
        sequences.append(_Sequence(runner.pool, ids[length:].astype(np.int32), _seed(ids), matcher))
        sequences[-1].extend(run)
    chosen = choose(runner, torch.stack(hidden), sequences, decoding)
    for j, (sequence, token) in enumerate(zip(sequences, chosen.tolist())):
        sequence.chose(chosen, j, decoding)
        sequence.accept(token, decoding, text, stats)
    scheduler.run(DecodeJob(runner, sequences, decoding, text, stats))
    if decoding.schema is not None and not all(decoding.schema.accepting(s.matcher) for s in sequences):
        raise ResourceExhausted(f"an answer's JSON was not complete after max_tokens ({decoding.max_tokens:,}) "
                                f"tokens: allow more")
    return [s.tokens for s in sequences]


def ideal(prompts: Sequence[int], generated: Sequence[int], max_tokens: int) -> Stats:
    """The least work of decoding answers of these lengths after prompts of these lengths (the prompts'
    prefill apart): each token fed back once (but an answer's last at `max_tokens`, which nothing follows),
    attending to its context, whose KV it reads; all answers together, a step per token of the longest. Its
    decoded_tokens are the tokens fed back (what a speed of light counts apart from prefill); its logical and
    generated tokens, what the answers hold (as Runtime.generate counts them)."""
    fed = [n - (n == max_tokens) for n in generated]
    return Stats(logical_tokens=sum(generated), fresh_tokens=sum(fed),
                 attention_pairs=sum(causal_pairs(f, p) for p, f in zip(prompts, fed)),
                 kv_written=sum(fed), kv_read=sum(f * p + f * (f - 1) // 2 for p, f in zip(prompts, fed)),
                 generated_tokens=sum(generated), decoded_tokens=sum(fed), decode_steps=max(fed, default=0))


def _seed(ids: np.ndarray) -> int:
    """A prompt's sampling seed: 32 bits of a hash of its token ids."""
    return int.from_bytes(hashlib.blake2b(ids.astype(np.int32).tobytes(), digest_size=4).digest(), "little")


def choose(runner: ModelRunner, hidden: torch.Tensor, sequences: Sequence[_Sequence],
           decoding: Decoding) -> torch.Tensor:
    """The token after each final hidden state, on the device (the full head in the model's precision,
    as HF transformers computes logits, then fp32): the first largest logit, or a draw as `Decoding`
    says, its noise seeded by the sequence's seed and its number of tokens chosen so far."""
    logits = (hidden @ runner.model.head_weight().T).float()
    if decoding.schema is not None:
        allowed = decoding.schema.allowed([s.matcher for s in sequences], logits.device)
        logits = logits.masked_fill(~allowed, float("-inf"))
    if decoding.temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits / decoding.temperature
    if decoding.top_p < 1:
        ordered, order = logits.sort(dim=-1, descending=True)
        before = ordered.softmax(dim=-1).cumsum(dim=-1) - ordered.softmax(dim=-1)  # mass of the likelier tokens
        logits = logits.scatter(-1, order, ordered.masked_fill(before >= decoding.top_p, float("-inf")))
    seeds = torch.tensor([s.seed for s in sequences], dtype=torch.int64, device=logits.device)
    steps = torch.tensor([len(s.tokens) + s.owed for s in sequences], dtype=torch.int64, device=logits.device)
    return (logits + _gumbel(seeds, steps, logits.shape[-1])).argmax(dim=-1)


def _gumbel(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel noise per (sequence, vocabulary entry) from a counter-based hash of (seed, step, entry):
    adding it to logits and taking the largest draws from their softmax. The same on every device."""
    mask = 0xFFFFFFFF
    x = (seeds[:, None] * 0x2545F491 + steps[:, None] * 0x9E3779B1
         + torch.arange(vocab, device=seeds.device, dtype=torch.int64)) & mask
    for _ in range(3):  # the murmur3 finalizer's mixing, thrice
        x = (((x >> 16) ^ x) * 0x45D9F3B) & mask
    uniform = (((x >> 16) ^ x).double() + 0.5) / 2 ** 32
    return -torch.log(-torch.log(uniform)).float()


class DecodeJob:
    """Sequences continued a token a pass: the scheduler's Job for decoding.

    Sequences continued a token a pass (the scheduler's Job): each pass takes every running sequence's
    next tokens (one, or the rest of a prompt the tree let go of, in parts of at most a pass) while the
    share admits them; after it, each sequence's run grows by what the pass kept and, where its feed
    ended, the next token is chosen on the device and fed to the next pass from there. The host reads a
    pass's tokens after queuing the next pass (`owed`), so a sequence that a token ended has had one more
    token computed for nothing; with a schema, whose grammar needs each token before the next is
    chosen, it reads them at once."""

    pass_tokens = DECODE_PASS_TOKENS

    def __init__(self, runner: ModelRunner, sequences: list[_Sequence], decoding: Decoding, text: Text,
                 stats: Stats) -> None:
        self.runner, self.decoding, self.text, self.stats = runner, decoding, text, stats
        self.running = [s for s in sequences if not s.ended]
        self.members: list[tuple[_Sequence, int]] = []  # this pass's sequences and how many of their feed
        self.start = 0  # the running sequence that leads the next pass (in turn: none waits behind the same others)
        self.owed: list[tuple[list[_Sequence], Chosen]] = []  # tokens chosen, not yet read, oldest first

    def done(self) -> bool:
        return not self.members and not self.running and not self.owed

    def fill(self, fill: Share) -> None:
        taken, before = {id(s) for s, _ in self.members}, len(self.members)
        for sequence in self.running[self.start:] + self.running[:self.start]:
            if not sequence.waiting or (taken and id(sequence) in taken):
                continue
            length = min(sequence.waiting, self.runner.token_budget)
            if not fill.admits(length):
                break
            fill.add(length)
            self.members.append((sequence, length))
        self.start = (self.start + len(self.members) - before) % len(self.running) if self.running else 0

    def rows(self, base: int) -> list[Row]:
        return [s.row(n) for s, n in self.members]

    def take(self, last: torch.Tensor, kept: list[KV | None]) -> None:
        finished = [j for j, ((sequence, n), new) in enumerate(zip(self.members, kept)) if sequence.computed(n, new)]
        members, self.members = self.members, []
        self.stats.decode_steps += 1
        self.stats.decoded_tokens += sum(n for _, n in members)
        chosen = [members[j][0] for j in finished]
        if chosen:
            if len(finished) < len(members):
                last = last.index_select(0, torch.tensor(finished, device=last.device))
            tokens = choose(self.runner, last, chosen, self.decoding)
            for j, sequence in enumerate(chosen):
                sequence.chose(tokens, j, self.decoding)
            self.owed.append((chosen, Chosen(tokens)))
        while self.owed and (len(self.owed) > 1 or self.decoding.schema is not None or
                             not any(s.waiting for s in self.running if not s.ended)):
            self._read()
        self.running = [s for s in self.running if not s.ended]
        self.start = self.start % len(self.running) if self.running else 0

    def _read(self) -> None:
        """The oldest tokens owed, read: each taken by its sequence, unless a token before ended it."""
        sequences, chosen = self.owed.pop(0)
        for sequence, token in zip(sequences, chosen.read()):
            if not sequence.ended:
                sequence.accept(token, self.decoding, self.text, self.stats)
