"""Asking the model about rows: rows become requests through the prompt layout, their passes queued, answers read.

- `Question` and `build_requests`: a row's prompt (documents, question, answer cue).
- `asking_together`: the requests of several yes/no questions built and queued in one call (passes shared);
  `Asking.read` waits for P(yes) per row. A row with a NULL argument is not asked (NaN).
- A prompt longer than the model's context is refused before any pass.
- Each kind's operator (filter.py, score.py, classify.py, complete.py) turns these answers into values.
"""

from __future__ import annotations

import hashlib
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from quail.engine.ai.kinds import DEFAULT_SELECTIVITY
from quail.engine.errors import InvalidArgument
from quail.engine.runtime.prompt import LAYOUTS, LETTERS
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.requests import LabelSet, Request, Segment
from quail.engine.runtime.replicas import RoutedScoring
from quail.engine.runtime.runtime import Runtime, Scoring
from quail.engine.runtime.step_parts import step_parts


ANSWERS = ("letters", "names", "text")


@dataclass(frozen=True)
class Question:
    """What each row is asked: a template over its documents, a layout, and yes/no or category answers.

    `anchor` is the placeholder whose document comes first in the prompt;
    categories are answered by letter or by name (`answers`: "letters", "names"); "text" asks a task
    answered in free text (generation) instead of a question, in JSON following `schema` where one is given.
    """

    template: str
    layout: str = "filter"
    labels: tuple[str, ...] = ()
    anchor: int = 0
    answers: str = "letters"
    schema: str | None = None

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


def _asked(runtime: Runtime, question: Question) -> str:
    """The text between the documents and the answer cue: the task, or the question and how to answer it."""
    if question.answers == "text":
        return runtime.layout.task(question.template, question.schema)
    return runtime.layout.question(question.template, question.labels, question.answers == "names")


def build_requests(runtime: Runtime, question: Question, docs: Sequence[Sequence[str]]) -> list[Request]:
    """One request per row; docs[i] holds that row's PROMPT arguments as text."""
    layout = runtime.layout
    preamble, asked, cue = runtime.segments([
        layout.preamble(),
        _asked(runtime, question) + ("\n\n" if question.layout == "join" else ""),
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


def present(args: Sequence[Sequence[str | None]]) -> list[int]:
    """The rows without a NULL argument."""
    rows = len(args[0]) if args else 0
    return [i for i in range(rows) if all(col[i] is not None for col in args)]


def prompts(runtime: Runtime, question: Question,
             args: Sequence[Sequence[str | None]]) -> tuple[list[int], list[Request]]:
    """The rows without a NULL argument, and their requests."""
    rows = present(args)
    return rows, build_requests(runtime, question, [[col[i] for col in args] for i in rows])


Job = tuple[Question, Sequence[Sequence[str | None]]]  # a question and its PROMPT arguments, a column each
_Part = tuple[dict[int, list[int]], dict[int, list[Request]]]  # a part of a step: its rows (job: row indices), requests
_Queued = tuple[dict[int, list[int]], dict[int, list[Request]], Scoring | RoutedScoring]  # a part, its passes queued


def asked_rows(runtime: Runtime, jobs: Sequence[Job], work: QueryWork | None
             ) -> list[tuple[list[int], list[Request], list[np.ndarray]]]:
    """Each job's rows without a NULL argument, their requests and their answers (`_launch`, then read)."""
    return _launch(runtime, jobs, work).read()


@dataclass
class _Launched:
    """The parts of a step queued on the device: each part's rows (job: row indices), requests and scoring."""

    jobs: int
    parts: list[_Queued]

    def read(self) -> list[tuple[list[int], list[Request], list[np.ndarray]]]:
        """Each job's rows without a NULL argument, their requests and their answers, once the device has them."""
        found: list[dict[int, tuple[Request, np.ndarray]]] = [{} for _ in range(self.jobs)]
        for members, requests, scoring in self.parts:
            answers = iter(scoring.read())
            for j, indices in members.items():
                found[j].update((i, (request, next(answers))) for i, request in zip(indices, requests[j]))
        out = []
        for answered in found:
            indices = sorted(answered)
            out.append((indices, [answered[i][0] for i in indices], [answered[i][1] for i in indices]))
        return out


def _launch(runtime: Runtime, jobs: Sequence[Job], work: QueryWork | None) -> _Launched:
    """Every forward pass of the jobs' rows queued (those without a NULL argument), their answers not read.

    The rows of all jobs go to the runtime in parts (`step_parts`: a large step's
    head, then its rest): the head's requests are built and its passes queued
    while, on a thread of its own, the rest's requests are built (tokenized) and
    planned and join the head's in the scheduler (a query's later part fills
    what the part before leaves of a pass: scheduler._share_out). The device
    starts after a head's worth of host work, not a step's, and goes from the
    head's passes to the rest's without waiting for the host. With a token
    limit, every part is built first, so that the step's tokens are counted
    before its first pass. A runtime that plans its own order (quail) gets the
    rows in the order of their anchor document's text, so rows that share a
    prefix share a part; the baselines get them in table order, in one call
    (the prefix baseline's block cache lives for a call). A step that fails
    cancels its query, so a part still being queued leaves the device.
    """
    rows = [(j, i) for j, (_, args) in enumerate(jobs) for i in present(args)]
    _refuse_too_long(runtime, jobs, rows)
    order, parts = _ordered_parts(runtime, jobs, rows)
    work = work if work is not None else QueryWork()
    work.announce(len(rows))

    def built(part: range) -> _Part:
        members: dict[int, list[int]] = {}
        for r in order[part.start:part.stop]:
            members.setdefault(rows[r][0], []).append(rows[r][1])
        return members, {j: build_requests(runtime, jobs[j][0], [[col[i] for col in jobs[j][1]] for i in indices])
                         for j, indices in members.items()}

    def launched(part: _Part) -> _Queued:
        members, asked = part
        return members, asked, runtime.launch([r for rs in asked.values() for r in rs], work)

    if work.max_tokens is not None:
        every = [built(part) for part in parts]
        work.check_tokens(sum(len(r) for _, requests in every for rs in requests.values() for r in rs))
        head, rest = every[:1], lambda: [launched(part) for part in every[1:]]
    else:
        head, rest = [built(part) for part in parts[:1]], lambda: [launched(built(part)) for part in parts[1:]]
    if len(parts) < 2:  # nothing to queue beside the head
        return _Launched(len(jobs), [launched(part) for part in head])
    with ThreadPoolExecutor(1, thread_name_prefix="quail-parts") as side:
        later = side.submit(rest)
        try:
            return _Launched(len(jobs), [launched(part) for part in head] + later.result())
        finally:
            if not later.done():
                work.cancel()
            later = None  # its error's traceback holds this frame: no cycle through it


def _refuse_too_long(runtime: Runtime, jobs: Sequence[Job], rows: list[tuple[int, int]]) -> None:
    """InvalidArgument, before any of the step's passes, when a row's prompt is longer than the model's
    context. A token is at least one byte of text, so only rows whose text (frame and arguments) has more
    bytes than the context holds tokens are tokenized here (once: the texts cache keeps them)."""
    limit = runtime.config.max_position
    layout = runtime.layout
    for j, (question, args) in enumerate(jobs):
        frame = _utf8(layout.preamble() + _asked(runtime, question) + layout.answer_cue())
        suspects = [i for jj, i in rows if jj == j and frame + sum(_utf8(layout.document(k, col[i]))
                                                                 for k, col in enumerate(args)) > limit]
        for i in suspects:
            longest = max((col[i] for col in args), key=len)
            runtime.refuse_too_long(build_requests(runtime, question, [[col[i] for col in args]]),
                                    f" asking {question.template!r} of a text beginning {longest[:40]!r}")


def _utf8(text: str) -> int:
    return len(text.encode())


def _ordered_parts(runtime: Runtime, jobs: Sequence[Job], rows: list[tuple[int, int]]
                   ) -> tuple[list[int], list[range]]:
    """The order in which the rows (job, row) go to the runtime, and the parts of that order: quail's
    runtime gets them as the scheduler orders and cuts them (`step_parts`); a baseline in table order, in
    one call (the prefix baseline's block cache lives for a call)."""
    if not runtime.plans_order:
        return list(range(len(rows))), [range(len(rows))] if rows else []
    return step_parts([_texts(jobs[j], i) for j, i in rows], runtime.runner.token_budget)


def _texts(job: Job, row: int) -> tuple[str, ...]:
    """The row's PROMPT arguments, its anchor's first."""
    question, args = job
    anchor = args[question.anchor][row]
    return (anchor, *(col[row] for k, col in enumerate(args) if k != question.anchor))


@dataclass(frozen=True)
class Ask:
    """A yes/no question over rows, and how its answers are decided.

    - `args`: one column (list of texts) per PROMPT argument;
    - `selectivity`, `decide`: how its answers are decided (by hash, on random weights);
    - `kept`: which rows the step keeps by their P(yes); the others' documents count less when the KV pool needs
      room (None: every row stays).
    """

    question: Question
    args: Sequence[Sequence[str | None]]
    selectivity: float = DEFAULT_SELECTIVITY
    decide: bool = True
    kept: Callable[[np.ndarray], np.ndarray] | None = None


def yes_probabilities(runtime: Runtime, question: Question, args: Sequence[Sequence[str | None]],
                      work: QueryWork | None = None, selectivity: float = DEFAULT_SELECTIVITY, decide: bool = True,
                      kept: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """P(yes) per row; args holds one column (list of texts) per PROMPT argument.

    A row with a NULL argument gets NaN: SQL's unknown. When the runtime decides
    by hash (random weights), the forward pass still runs in full; a decision
    (`decide`) is then yes for a `selectivity` fraction of prompts, and a score
    the prompt's uniform content hash. `kept`: which rows a filter keeps; the rows it
    rejects leave the query, so their documents go first when the KV pool needs room (unless a
    row that passed shares them: a join's anchor).
    """
    return asking_together(runtime, [Ask(question, args, selectivity, decide, kept)], work).read()[0]


@dataclass
class Asking:
    """Questions whose forward passes are queued on the device.

    (all of them: the host is free to prepare
    other work while they run); `read` waits for their answers."""

    runtime: Runtime
    asks: Sequence[Ask]
    launched: _Launched

    def read(self) -> list[np.ndarray]:
        """P(yes) per row of each question (as yes_probabilities)."""
        return [_probabilities(self.runtime, ask, *found) for ask, found in zip(self.asks, self.launched.read())]


def asking_together(runtime: Runtime, asks: Sequence[Ask], work: QueryWork | None = None) -> Asking:
    """The questions' requests built and their passes queued, all in one call (their forward passes are shared,
    and so is what their prompts have in common); their answers are read later (`Asking.read`)."""
    return Asking(runtime, asks, _launch(runtime, [(ask.question, ask.args) for ask in asks], work))


def _words(text: str) -> set[str]:
    """The words of four letters or more, in lower case."""
    return {word.lower() for word in re.findall(r"[A-Za-z]{4,}", text)}


def rule_says_yes(template: str, documents: Sequence[str]) -> bool:
    """The answer of the "rule" decisions: yes when a document holds a word of four letters or more of the
    question (outside its placeholders), in any case (answers an embedding can learn, for benchmarks).

    >>> rule_says_yes("Does {0} mention kittens?", ["Two KITTENS slept."]), rule_says_yes("Is {0} red?", ["red"])
    (True, False)
    """
    return bool(_words(re.sub(r"\{\d+\}", " ", template)) & set().union(*map(_words, documents)))


def rule_category(labels: Sequence[str], documents: Sequence[str]) -> int:
    """The category of the "rule" decisions: the first whose words (four letters or more) a document holds,
    else the last.

    >>> rule_category(["kitten", "puppy", "other"], ["The puppy slept."]), rule_category(["kitten", "other"], ["x"])
    (1, 1)
    """
    held = set().union(*map(_words, documents))
    return next((k for k, label in enumerate(labels) if _words(label) & held), len(labels) - 1)


def _probabilities(runtime: Runtime, ask: Ask, present: list[int], requests: list[Request],
                   answers: list[np.ndarray]) -> np.ndarray:
    probs = np.full(len(ask.args[0]) if ask.args else 0, np.nan)
    for i, request, logp in zip(present, requests, answers):
        if runtime.decisions == "hash":
            u = content_hash(request)
            probs[i] = float(u < ask.selectivity) if ask.decide else u
        elif runtime.decisions == "rule":
            probs[i] = float(rule_says_yes(ask.question.template, [col[i] for col in ask.args]))
        else:
            probs[i] = float(np.exp(logp[1]))
    if ask.kept is not None:
        passed = ask.kept(probs[present]).tolist()
        runtime.forget([r for r, ok in zip(requests, passed) if not ok], [r for r, ok in zip(requests, passed) if ok])
    return probs
