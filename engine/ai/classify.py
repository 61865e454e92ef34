"""AI_CLASSIFY's operator (BigQuery's AI.CLASSIFY): the most probable of a call's categories per row.

- Categories answered by letter: one pass per row, the letters' logits read at the answer cue.
- Categories answered by name: the names' token trie asked at each branch point (labels.py), log P(name) summed.
- Random weights choose a category by the prompt's content hash ("rule" decisions: asking.rule_category). Asked in a call of its own (not shared).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from quail.engine.ai.asking import Question, asked_rows, content_hash, prompts, rule_category
from quail.engine.ai.labels import Branch, branches, name_logprobs
from quail.engine.ai.operator import Alone, Call
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.requests import LabelSet, Request, Segment
from quail.engine.runtime.runtime import Runtime


class Classify(Alone):
    """The chosen category per row, a VARCHAR (NULL where an argument is NULL)."""

    def answer(self, runtime: Runtime, call: Call, work: QueryWork | None) -> pa.Array:
        return pa.array(classify(runtime, call.question, call.args, work), pa.string())


CLASSIFY = Classify()


def classify(runtime: Runtime, question: Question, args: Sequence[Sequence[str | None]],
             work: QueryWork | None = None) -> list[str | None]:
    """The most probable category per row (None where an argument is NULL)."""
    if question.answers == "names":
        present, requests, scores = _ask_by_name(runtime, question, args, work)
    else:
        present, requests, scores = asked_rows(runtime, [(question, args)], work)[0]
    out: list[str | None] = [None] * (len(args[0]) if args else 0)
    for i, request, logp in zip(present, requests, scores):
        if runtime.decisions == "hash":
            index = int(content_hash(request) * len(question.labels))
        elif runtime.decisions == "rule":
            index = rule_category(question.labels, [col[i] for col in args])
        else:
            index = int(np.argmax(logp))
        out[i] = question.labels[index]
    return out


def _ask_by_name(runtime: Runtime, question: Question, args: Sequence[Sequence[str | None]],
                 work: QueryWork | None) -> tuple[list[int], list[Request], list[np.ndarray]]:
    """Each row's prompt, asked once per branch point of the names' token trie (labels.py):
    the rows, their prompts, and log P(name) per name."""
    present, rows = prompts(runtime, question, args)
    found = branches([list(runtime.tokenizer.encode(name)) for name in question.labels])
    asked_at = [_branch_ask(runtime, branch) for branch in found]
    asked = [Request(prompt.segments + path, labels) for prompt in rows for path, labels in asked_at]
    answers = runtime.score(asked, work)
    per_row = len(found)
    scores = [name_logprobs(found, answers[k * per_row:(k + 1) * per_row], len(question.labels))
              for k in range(len(rows))]
    return present, rows, scores


def _branch_ask(runtime: Runtime, branch: Branch) -> tuple[tuple[Segment, ...], LabelSet]:
    """What follows every prompt at a branch point: its path as a segment, and the tokens where names part."""
    ways = tuple(branch.ways)
    labels = LabelSet(tuple(str(t) for t in ways), ways, tuple(range(len(ways))))
    path = (Segment.of(np.array(branch.path, dtype=np.int32), runtime.model_id),) if branch.path else ()
    return path, labels