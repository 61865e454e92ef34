"""AI operators: rows become model requests through the prompt layout, answers become values."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .errors import InvalidArgument
from .label_trie import Branch, branches, name_logprobs
from .prompt import LAYOUTS, LETTERS
from .requests import LabelSet, Request, Segment
from .runtime import Runtime
from .work import QueryWork


ANSWERS = ("letters", "names")


@dataclass(frozen=True)
class Question:
    """What each row is asked: a template over its documents, a layout, and yes/no or category answers.

    `anchor` is the placeholder whose document comes first in the prompt;
    categories are answered by letter or by name (`answers`: "letters", "names").
    """

    template: str
    layout: str = "filter"
    labels: tuple[str, ...] = ()
    anchor: int = 0
    answers: str = "letters"

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown prompt layout {self.layout!r}")
        if self.answers not in ANSWERS:
            raise ValueError(f"unknown way of answering {self.answers!r}")
        if len(self.labels) > len(LETTERS) or len(set(self.labels)) != len(self.labels):
            raise InvalidArgument(f"categories must be distinct and at most {len(LETTERS)}")


def _documents(runtime: Runtime, docs: Sequence[Sequence[str]]) -> list[list[Segment]]:
    """Each row's document segments; every distinct (position, text) is tokenized once."""
    distinct = list(dict.fromkeys((k, text) for row in docs for k, text in enumerate(row)))
    segments = dict(zip(distinct, runtime.segments([runtime.layout.document(k, t) for k, t in distinct])))
    return [[segments[(k, text)] for k, text in enumerate(row)] for row in docs]


def _labels(runtime: Runtime, question: Question) -> LabelSet:
    if not question.labels:
        return runtime.yes_no
    return runtime.letters(len(question.labels), question.labels)


def build_requests(runtime: Runtime, question: Question, docs: Sequence[Sequence[str]]) -> list[Request]:
    """One request per row; docs[i] holds that row's PROMPT arguments as text."""
    layout = runtime.layout
    preamble, asked, cue = runtime.segments([
        layout.preamble(),
        layout.question(question.template, question.labels, question.answers == "names")
        + ("\n\n" if question.layout == "join" else ""),
        layout.answer_cue(),
    ])
    labels = _labels(runtime, question)
    requests = []
    for row in _documents(runtime, docs):
        first, rest = row[question.anchor], row[: question.anchor] + row[question.anchor + 1:]
        if question.layout == "join":
            segments = (preamble, first, asked, *rest, cue)
        else:
            segments = (preamble, first, *rest, asked, cue)
        requests.append(Request(segments, labels))
    return requests


def content_hash(request: Request) -> float:
    """A uniform number in [0, 1) fixed by the prompt's content: decisions for random weights."""
    digest = hashlib.blake2b(b"".join(s.key for s in request.segments), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def _prompts(runtime: Runtime, question: Question,
             args: Sequence[Sequence[str | None]]) -> tuple[list[int], list[Request]]:
    """The rows without a NULL argument, and their requests."""
    rows = len(args[0]) if args else 0
    present = [i for i in range(rows) if all(col[i] is not None for col in args)]
    return present, build_requests(runtime, question, [[col[i] for col in args] for i in present])


def _ask(runtime: Runtime, question: Question, args: Sequence[Sequence[str | None]],
         work: QueryWork | None) -> tuple[list[int], list[Request], list[np.ndarray]]:
    present, requests = _prompts(runtime, question, args)
    return present, requests, runtime.score(requests, work)


@dataclass(frozen=True)
class Ask:
    """A yes/no question over rows: args holds one column (list of texts) per PROMPT argument; how its
    answers are decided (`selectivity`, `decide`) and whether rejected rows leave the prefix cache."""

    question: Question
    args: Sequence[Sequence[str | None]]
    selectivity: float = 0.2
    decide: bool = True
    forget_rejected: bool = False


def yes_probabilities(runtime: Runtime, question: Question, args: Sequence[Sequence[str | None]],
                      work: QueryWork | None = None, selectivity: float = 0.2, decide: bool = True,
                      forget_rejected: bool = False) -> np.ndarray:
    """P(yes) per row; args holds one column (list of texts) per PROMPT argument.

    A row with a NULL argument gets NaN: SQL's unknown. When the runtime decides
    by hash (random weights), the forward pass still runs in full; a decision
    (`decide`) is then yes for a `selectivity` fraction of prompts, and a score
    the prompt's uniform content hash. `forget_rejected`: a filter's rejected
    rows leave the query, so their documents leave the prefix cache.
    """
    return yes_probabilities_together(runtime, [Ask(question, args, selectivity, decide, forget_rejected)], work)[0]


def yes_probabilities_together(runtime: Runtime, asks: Sequence[Ask], work: QueryWork | None = None
                               ) -> list[np.ndarray]:
    """P(yes) per row of each question (as yes_probabilities), all their requests scored in one call:
    their forward passes are shared, and so is what their prompts have in common."""
    prompts = [_prompts(runtime, ask.question, ask.args) for ask in asks]
    answers = runtime.score([request for _, requests in prompts for request in requests], work)
    out, offset = [], 0
    for ask, (present, requests) in zip(asks, prompts):
        out.append(_probabilities(runtime, ask, present, requests, answers[offset:offset + len(requests)]))
        offset += len(requests)
    return out


def _probabilities(runtime: Runtime, ask: Ask, present: list[int], requests: list[Request],
                   answers: list[np.ndarray]) -> np.ndarray:
    probs = np.full(len(ask.args[0]) if ask.args else 0, np.nan)
    for i, request, logp in zip(present, requests, answers):
        if runtime.decisions == "hash":
            u = content_hash(request)
            probs[i] = float(u < ask.selectivity) if ask.decide else u
        else:
            probs[i] = float(np.exp(logp[1]))
    if ask.forget_rejected:
        runtime.forget([request for i, request in zip(present, requests) if not probs[i] > 0.5])
    return probs


def classify(runtime: Runtime, question: Question, args: Sequence[Sequence[str | None]],
             work: QueryWork | None = None) -> list[str | None]:
    """The most probable category per row (None where an argument is NULL)."""
    if question.answers == "names":
        present, requests, scores = _ask_by_name(runtime, question, args, work)
    else:
        present, requests, scores = _ask(runtime, question, args, work)
    out: list[str | None] = [None] * (len(args[0]) if args else 0)
    for i, request, logp in zip(present, requests, scores):
        if runtime.decisions == "hash":
            index = int(content_hash(request) * len(question.labels))
        else:
            index = int(np.argmax(logp))
        out[i] = question.labels[index]
    return out


def _ask_by_name(runtime: Runtime, question: Question, args: Sequence[Sequence[str | None]],
                 work: QueryWork | None) -> tuple[list[int], list[Request], list[np.ndarray]]:
    """Each row's prompt, asked once per branch point of the names' token trie (label_trie.py):
    the rows, their prompts, and log P(name) per name."""
    present, prompts = _prompts(runtime, question, args)
    found = branches([list(runtime.tokenizer.encode(name)) for name in question.labels])
    asked_at = [_branch_ask(runtime, branch) for branch in found]
    asked = [Request(prompt.segments + path, labels) for prompt in prompts for path, labels in asked_at]
    answers = runtime.score(asked, work)
    per_row = len(found)
    scores = [name_logprobs(found, answers[k * per_row:(k + 1) * per_row], len(question.labels))
              for k in range(len(prompts))]
    return present, prompts, scores


def _branch_ask(runtime: Runtime, branch: Branch) -> tuple[tuple[Segment, ...], LabelSet]:
    """What follows every prompt at a branch point: its path as a segment, and the tokens where names part."""
    ways = tuple(branch.ways)
    labels = LabelSet(tuple(str(t) for t in ways), ways, tuple(range(len(ways))))
    path = (Segment.of(np.array(branch.path, dtype=np.int32), runtime.model_id),) if branch.path else ()
    return path, labels