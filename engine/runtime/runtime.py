"""The runtime: owns the model, tokenizer and prompt layout, and scores requests from every query."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import torch

from quail.engine.errors import InvalidArgument
from quail.engine.kv.resident import ResidentTree
from quail.engine.model.config import DECISIONS
from quail.engine.model.decoder import Decoder
from quail.engine.model.tokenizer import Tokenizer
from quail.engine.runtime import baselines, decode
from quail.engine.runtime.counters import Stats
from quail.engine.runtime.embeddings import Embeddings
from quail.engine.runtime.memo import Memo
from quail.engine.runtime.grammar import GrammarTokens, Schema
from quail.engine.runtime.model_runner import ModelRunner, disk_tier, host_tier, kv_pool
from quail.engine.runtime.prompt import FALSE_SPELLINGS, LETTERS, TRUE_SPELLINGS, ChatFrame, PromptLayout
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.replicas import Replicas, RoutedScoring
from quail.engine.runtime.scheduler import PassScheduler
from quail.engine.runtime.requests import LabelSet, Request, Segment, document_prefix, segments_key
from quail.engine.runtime.tree_job import Strategy, tree
from quail.engine.runtime.text_segments import SegmentCache


STRATEGIES: dict[str, Strategy] = {"quail": tree, "naive": baselines.independent, "prefix": baselines.block_prefix}


@dataclass
class Scoring:
    """Answers being computed on the device.

    (request indices, their log-probabilities) per label set,
    every request in one of them."""

    groups: list[tuple[list[int], torch.Tensor]]

    def read(self) -> list[np.ndarray]:
        """Per-answer log-probabilities of each request, once the device has them."""
        out: list[np.ndarray] = [np.empty(0)] * sum(len(members) for members, _ in self.groups)
        for members, logprobs in self.groups:
            for i, row in zip(members, logprobs.cpu().numpy()):
                out[i] = row
        return out


@dataclass
class Generated:
    """Continuations computed already (Runtime.generate on this device): read as Scoring is."""

    tokens: list[list[int]]

    def read(self) -> list[list[int]]:
        return self.tokens


class Runtime:
    """The model runtime: one per device, serving every running query.

    One per device, serving every running query: it builds the device's model runner
    (model_runner.ModelRunner) and, beside it, the scheduler that packs every query's forward passes
    together (scheduler.PassScheduler) and drives the runner.

    `strategy` is how requests become forward passes: a name from STRATEGIES
    ("quail": the scheduler's `tree`, every common prefix once; "naive" and "prefix": baselines.py)
    or a Strategy function (a benchmark baseline).
    `decisions` is "model" (answers from the model), "hash" (random weights:
    answers by content hash) or "rule" (answers by a fixed rule over the text, asking.rule_says_yes and rule_category:
    answers an embedding can learn, for benchmarks); forward passes run in full in every mode.
    `device_of`: a runtime on the same device, whose scheduler, KV ledger, pool, resident tree and graphs this
    runtime shares; else a pool of `kv_bytes` holds KV, and what it computes stays there between
    steps and queries, indexed by a resident tree (kv/resident.py; 0: nothing stays), with `kv_host_bytes`
    of pinned host memory for what the pool has no room for (kv/host_tier.py; 0: none), and `kv_disk`
    (directory, bytes) a file there for what the host tier has no room for (None: none).
    `texts`: the tokenized texts kept between steps and queries (default: a cache of its own).
    `names`: what else queries may call the model (the name it was served by), besides its id and "default".
    `embeddings`: the embedding model AI_EMBED asks (default: the embedded one, loaded on first use).
    """

    def __init__(self, model_id: str, model: Decoder, tokenizer: Tokenizer, frame: ChatFrame,
                 strategy: str | Strategy = "quail", token_budget: int = 4096, decisions: str = "model",
                 device_of: Runtime | None = None, kv_bytes: int = 0, kv_host_bytes: int = 0,
                 kv_disk: tuple[Path, int] | None = None, texts: SegmentCache | None = None,
                 names: tuple[str, ...] = (), embeddings: Embeddings | None = None) -> None:
        if isinstance(strategy, str) and strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
        if decisions not in DECISIONS:
            raise ValueError(f"decisions must be one of {', '.join(DECISIONS)}, not {decisions!r}")
        self.decisions = decisions
        self.model_id = model_id
        self.config = model.config
        self.tokenizer = tokenizer
        self.layout = PromptLayout(frame)
        if device_of is None:
            pool = kv_pool(model, kv_bytes)
            host = host_tier(pool, kv_host_bytes) if pool.slots else None
            if kv_disk is not None and host is None:
                raise InvalidArgument("--kv-disk-dir needs a KV pool and a host tier (--kv-host-bytes): the disk "
                                      "tier takes what the host tier has no room for")
            disk = disk_tier(pool, *kv_disk) if kv_disk is not None else None
            tree = ResidentTree(pool, host, disk) if pool.slots else None
            self.runner = ModelRunner(model, token_budget, pool=pool, tree=tree)
            self.scheduler = PassScheduler(self.runner)
        else:
            shared = device_of.runner
            self.runner = ModelRunner(model, token_budget, ledger=shared.ledger, pool=shared.pool, tree=shared.tree,
                                      steps=shared.steps, passes=shared.passes)
            self.scheduler = device_of.scheduler
        self.strategy = strategy
        self.texts = texts if texts is not None else SegmentCache()
        self.embeddings = embeddings if embeddings is not None else Embeddings(device=str(self.runner.device))
        self.memo = Memo()  # what a query computed that a later one over the same rows reuses (a cascade's)
        self.yes_no = self._yes_no_labels()
        self.end_of_turn = frozenset(self._single_token((frame.turn_end,))) if frame.turn_end else frozenset()
        self.names = frozenset(n.lower() for n in (model_id, "default", *names))
        self._grammar_tokens: GrammarTokens | None = None
        self._preamble_tokens: int | None = None
        self.replicas: Replicas | None = None  # the other replicas requests are routed to (replicas.py)

    def variant(self, strategy: str | Strategy, token_budget: int | None = None,
                decisions: str | None = None) -> "Runtime":
        """Another runtime over the same weights and tokenizer (and the device's scheduler, KV ledger, pool
        and tree, and the tokenized texts), scoring by another strategy (or deciding another way)."""
        return Runtime(self.model_id, self.runner.model, self.tokenizer, self.layout.frame, strategy,
                       token_budget or self.runner.token_budget, decisions or self.decisions, self, texts=self.texts,
                       names=tuple(self.names), embeddings=self.embeddings)

    def segments(self, texts: list[str]) -> list[Segment]:
        """Each text as a segment of its own, tokenized once (the texts cache)."""
        return self.texts.segments(texts, self._tokenized)

    def warm(self, texts: pa.Array | pa.ChunkedArray, placeholder: int = 0) -> int:
        """Tokenize the texts as placeholder {placeholder}'s documents (the prompt layout) into the texts cache,
        as a query over their rows would, unless the cache is half full or more; how many token ids the cache
        grew by meanwhile. A table's text column warmed as it is written spares the queries over its rows their
        tokenizing."""
        if 2 * self.texts.tokens >= self.texts.max_tokens:
            return 0
        before = self.texts.tokens
        self.segments([self.layout.document(placeholder, str(text)) for text in texts.to_pylist() if text is not None])
        return self.texts.tokens - before

    def _tokenized(self, texts: list[str]) -> list[Segment]:
        return [Segment.of(ids, self.model_id) for ids in self.tokenizer.encode_batch(texts)]

    def score(self, requests: Sequence[Request], work: QueryWork | None = None) -> list[np.ndarray]:
        """Per-answer log-probabilities of each request (answer order = its label set's names).

        The requests and the work done for them are added to `work`.
        """
        return self.launch(requests, work).read()

    def launch(self, requests: Sequence[Request], work: QueryWork | None = None) -> "Scoring | RoutedScoring":
        """The requests' forward passes queued on the device, their answers read later (`Scoring.read`),
        so the host can build the next requests while these passes run; otherwise as `score`. With
        replicas, each request is computed on the one its document is routed to (replicas.py)."""
        if not requests:
            return Scoring([])
        work = self._admitted(requests, work)
        if self.replicas is not None:
            return self.replicas.launch(requests, work, self._scoring)
        return self._scoring(requests, work)

    def hidden(self, requests: Sequence[Request], work: QueryWork) -> list[torch.Tensor]:
        """Each request's final-normed hidden state at its last token (an embedding model's output), its passes
        on this runtime's scheduler; InvalidArgument for a request longer than the model's context."""
        return self._hidden(requests, self._admitted(requests, work))

    def _admitted(self, requests: Sequence[Request], work: QueryWork | None, extra: int = 0) -> QueryWork:
        """The query's work (a new one for None) with the requests counted against its limits and added, after
        refusing any longer than the model's context with `extra` tokens to generate (InvalidArgument)."""
        self.refuse_too_long(requests, extra=extra)
        work = work if work is not None else QueryWork()
        work.count(len(requests))
        work.spend_tokens(sum(len(r) for r in requests))
        work.requests.extend(requests)
        work.check()
        return work

    def _hidden(self, requests: Sequence[Request], work: QueryWork) -> list[torch.Tensor]:
        """The requests' last hidden states, by the runtime's strategy (counted already)."""
        strategy = STRATEGIES[self.strategy] if isinstance(self.strategy, str) else self.strategy
        return strategy(self.scheduler, self.runner.for_query(work.check, work.under_way.set), requests, work.stats)

    def _scoring(self, requests: Sequence[Request], work: QueryWork) -> "Scoring":
        """The requests' passes queued on this runtime's device (counted already)."""
        hidden = self._hidden(requests, work)
        by_labels: dict[LabelSet, list[int]] = {}
        for i, request in enumerate(requests):
            by_labels.setdefault(request.labels, []).append(i)
        groups = [(members, self.runner.answer_logprobs(torch.stack([hidden[i] for i in members]), labels))
                  for labels, members in by_labels.items()]
        return Scoring(groups)

    def generate(self, requests: Sequence[Request], decoding: decode.Decoding,
                 work: QueryWork | None = None) -> list[list[int]]:
        """The continuation of each request's prompt, as `decoding` says (decode.py; the requests' label sets
        are not read): its token ids, the stop token not among them. The work is added to `work`, whose check
        (cancellation, deadline, generated tokens) runs before every pass. With replicas, each request is
        continued on the one its document is routed to (replicas.py), and the query's limits checked again on
        what they all generated."""
        if not requests:
            return []
        work = self._admitted(requests, work, decoding.max_tokens)
        if self.replicas is not None:
            generated = self.replicas.launch(requests, work, partial(self._generating, decoding), decoding).read()
            work.check()
        else:
            generated = self._generating(decoding, requests, work).read()
        work.stats.logical_tokens += sum(map(len, generated))  # the prompts and, fed back, what they generated
        work.decoded = work.decoded.plus(decode.ideal([len(r) for r in requests], [len(g) for g in generated],
                                                      decoding.max_tokens))
        return generated

    def _generating(self, decoding: decode.Decoding, requests: Sequence[Request], work: QueryWork) -> "Generated":
        """The requests continued on this runtime's device (counted already)."""
        runner = self.runner.for_query(work.check, work.under_way.set)
        return Generated(decode.generate(self.scheduler, runner, requests, decoding, self.tokenizer.decode,
                                         work.stats))

    def schema(self, schema: str) -> Schema:
        """A JSON schema's grammar over this model's vocabulary (decode.Decoding.schema); InvalidArgument when
        the chat template names no token that ends the model's turn (a complete answer ends there)."""
        if not self.end_of_turn:
            raise InvalidArgument(f"the model {self.model_id} has no chat template that ends its turn: it cannot "
                                  f"answer in a response format")
        if self._grammar_tokens is None:
            self._grammar_tokens = GrammarTokens(self.tokenizer.to_json(), self.config.vocab_size,
                                                 min(self.end_of_turn))
        return self._grammar_tokens.schema(schema)

    def refuse_too_long(self, requests: Sequence[Request], where: str = "", extra: int = 0) -> None:
        """InvalidArgument when a request, with `extra` tokens to generate after it, is longer than the model's
        context (it would never be answered right, and would hold the device for nothing)."""
        longest = max((len(r) for r in requests), default=0)
        if longest + extra > self.config.max_position:
            more = f" and {extra:,} to generate" if extra else ""
            fewer = " or generate fewer tokens (max_tokens)" if extra else ""
            raise InvalidArgument(f"a prompt{where} has {longest:,} tokens{more}; the model {self.model_id} reads at "
                                  f"most {self.config.max_position:,}: shorten its text{fewer}")

    @property
    def plans_order(self) -> bool:
        """Whether this runtime's strategy plans the order of what it computes (quail's radix plan), so
        requests may come in any order; the baselines take them in the order given, as a generic server."""
        return self.strategy == "quail"

    def warm_up(self, full: bool | None = None) -> Stats:
        """Run the passes queries bring, so the first query does not pay for first calls (kernels loaded
        lazily, layers compiled, GEMMs of a full pass); returns what they did. full (default: on a GPU):
        rows of more than a full pass after a shared prefix as long as each (copied before each row on a
        GPU), then short rows after two long prefixes (attended apart and merged), then every decode step
        graph captured (CUDA); always one short request alone (compiled layers specialize a size of one).
        On a GPU, full or not, the passes' graphs are captured then (an embedding model's small passes
        replay too).
        With a host KV tier, then a pass of new rows is timed against its copy back from the tier
        (`_time_host_tier`). Last, every object alive (the model's modules, the tokenizer's vocabulary,
        the libraries') leaves the cyclic garbage collector's view (`gc.freeze`): decoding makes objects
        by the thousand a step, and each full collection they bring on would walk all of those again."""
        rng = np.random.default_rng(0)

        def segment(n: int) -> Segment:
            return Segment.of(rng.integers(100, 1000, n), self.model_id)

        work = QueryWork()
        self.score([Request((segment(16),), self.yes_no)], work)  # a pass of one row: the last layer's one position
        on_gpu = self.runner.device.type == "cuda"
        if on_gpu if full is None else full:
            shared = segment(200)  # kept (radix.worth_keeping) and copied (pass_rows.Packed): both bounds met
            rows = [(shared, segment(200)) for _ in range(self.runner.token_budget // 200 + 8)]
            anchors = [segment(600) for _ in range(2)]
            partners = [(anchor, segment(12)) for anchor in anchors for _ in range(60)]
            self.score([Request(parts, self.yes_no) for parts in rows + partners], work)
            if self.runner.steps is not None:
                self.runner.steps.prepare()
        if on_gpu and self.runner.passes is not None:
            self.runner.passes.prepare()
        if self.runner.tree is not None and self.runner.tree.host is not None:
            self._time_host_tier([Request((segment(128),), self.yes_no)
                                  for _ in range(self.runner.token_budget // 128)])
        gc.freeze()
        return work.stats

    def _time_host_tier(self, requests: list[Request]) -> None:
        """Time the new requests computed, then, moved to the host tier, copied back with their last tokens
        computed: the tier restores runs when that was faster (HostTier.restores)."""
        tree = self.runner.tree
        tree.host.recompute_s = tree.host.restore_s = None  # restoring, for the second timing

        def timed() -> float:
            began = time.perf_counter()
            self.score(requests, QueryWork())
            return time.perf_counter() - began

        computed = timed()
        tree.evict(tree.pool.slots)  # all the runs no query holds, to the host tier as far as it has room
        tree.host.recompute_s, tree.host.restore_s = computed, timed()

    def forget(self, rejected: Sequence[Request], accepted: Sequence[Request]) -> None:
        """The rejected requests' documents (what follows the preamble), with all that continues them, go
        first when the pool needs room, but those an accepted request shares: the plan will not ask about
        them again (a join's anchor stays while a partner of it passed). Noted here, and done when the tree
        next changes (ResidentTree.demote_later): the query's answers do not wait for it."""
        if self.replicas is not None:
            self.replicas.forget(rejected, accepted)
        if self.runner.tree is not None:
            self.runner.tree.demote_later(partial(_demotions, rejected, accepted), len(rejected))

    def rows_cached(self, tokens_per_document: float) -> int | None:
        """How many rows' document prefixes (the preamble and a document of this many tokens) the KV pool
        holds at once (None: nothing is kept between steps)."""
        if self.runner.tree is None:
            return None
        if self._preamble_tokens is None:
            self._preamble_tokens = len(self.tokenizer.encode(self.layout.preamble()))
        return max(1, int(self.runner.pool.slots // (self._preamble_tokens + tokens_per_document)))

    def resident_share(self, texts: pa.Array | pa.ChunkedArray, placeholder: int = 0, sample: int = 64) -> float:
        """requests.ResidentShare: of the documents these texts make as placeholder {placeholder}'s, the share
        of their tokens whose whole document prefix (the preamble, then the document, laid out and tokenized
        as every request over them is: the prompt layout and the texts cache) the resident tree holds now
        (with replicas, the tree of the replica each document was routed to: Replicas.resident_lengths).
        Reads at most `sample` rows, evenly spaced (the same rows every time), looked up without counting in
        the hit rate (in the lower tiers too, when it would be copied back: a document's tokens there count
        less by what copying them back costs, HostTier.copy_cost; a replica's count as in its pool); 0 without a
        tree, texts or anything resident. Thread-safe (the texts cache and the tree lock themselves)."""
        tree = self.runner.tree
        if tree is None or not len(texts) or (
                self.replicas is None and not tree.tokens + tree.host_tokens + tree.disk_tokens):
            return 0.0
        rows = np.unique(np.linspace(0, len(texts) - 1, min(sample, len(texts))).astype(np.int64))
        picked = (texts[int(row)].as_py() for row in rows)  # any string type (pyarrow's take lacks string_view)
        documents = [self.layout.document(placeholder, str(text)) for text in picked if text is not None]
        if not documents:
            return 0.0
        preamble, *segments = self.segments([self.layout.preamble(), *documents])
        prompts = [np.concatenate([preamble.ids, s.ids]) for s in segments]
        if self.replicas is None:
            found = [tree.resident(prompt) for prompt in prompts]
        else:
            keys = [segments_key((preamble, s)) for s in segments]
            found = [(length, 0.0) for length in self.replicas.resident_lengths(keys, prompts, tree.resident_length)]
        resident = sum(len(s) * (1 - copying / length) for s, (length, copying) in zip(segments, found)
                       if length == len(preamble) + len(s))
        return resident / sum(len(s) for s in segments)

    def letters(self, count: int, names: tuple[str, ...]) -> LabelSet:
        """Answers A, B, ... (one per category name), each spelled by its single-token letter."""
        ids = [self._single_token((LETTERS[i], " " + LETTERS[i])) for i in range(count)]
        if not all(ids):
            raise ValueError("the tokenizer does not spell every category letter as a single token")
        return LabelSet(names, tuple(t for spelled in ids for t in spelled),
                        tuple(i for i, spelled in enumerate(ids) for _ in spelled))

    def _single_token(self, spellings: tuple[str, ...]) -> list[int]:
        ids = [self.tokenizer.encode(s) for s in spellings]
        return list(dict.fromkeys(int(t[0]) for t in ids if len(t) == 1))

    def _yes_no_labels(self) -> LabelSet:
        false_ids, true_ids = self._single_token(FALSE_SPELLINGS), self._single_token(TRUE_SPELLINGS)
        if not false_ids or not true_ids:
            raise ValueError("the tokenizer spells neither Yes nor No as a single token")
        return LabelSet(("false", "true"), tuple(false_ids + true_ids), (0,) * len(false_ids) + (1,) * len(true_ids))


def _demotions(rejected: Sequence[Request], accepted: Sequence[Request]) -> list[tuple[np.ndarray, int]]:
    """What Runtime.forget demotes: (the prompt's first tokens through its document, the preamble's length)
    of each rejected request's document that no accepted request shares, once per document."""
    kept = {prefix[1] for prefix in map(document_prefix, accepted) if prefix is not None}
    out = []
    for request in rejected:
        prefix = document_prefix(request)
        if prefix is not None and prefix[1] not in kept:
            kept.add(prefix[1])
            out.append((request.tokens(0, prefix[0]), request.offsets[1]))
    return out
