"""AI aggregation (AI_AGG, AI_SUMMARIZE_AGG): each group's texts reduced by the model to one answer.

A group's texts (NULLs left out) are packed, in order, into prompts of as many
texts as fit the model's context beside the answer's tokens (at most `fan_in`);
a prompt is [preamble + Task: instruction][Text 1]...[Text k][answer cue], so
every prompt of every group shares the instruction's KV. A group whose texts fit
one prompt is answered by it; otherwise each prompt's answer becomes a text of
the next level, reduced the same way until one answer remains (a reduction
tree). Every prompt of a level, over all groups, is generated in one call.
"""

from __future__ import annotations

from typing import Sequence

from quail.engine.ai.complete import decoding as decoding_of
from quail.engine.ai.options import Aggregation
from quail.engine.errors import InvalidArgument
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.requests import Request, Segment
from quail.engine.runtime.runtime import Runtime


def aggregate(runtime: Runtime, aggregation: Aggregation, groups: Sequence[Sequence[str | None] | None],
              work: QueryWork | None = None) -> list[str | None]:
    """Each group's answer (None for a group of no texts), reduced level by level."""
    decoding = decoding_of(aggregation.generation, runtime)
    head, cue = runtime.segments([runtime.layout.preamble() + runtime.layout.task(aggregation.instruction) + "\n\n",
                                  runtime.layout.answer_cue()])
    room = runtime.config.max_position - decoding.max_tokens - len(head) - len(cue)
    answers: list[str | None] = [None] * len(groups)
    pending = {g: [t for t in texts if t is not None] for g, texts in enumerate(groups) if texts}
    pending = {g: texts for g, texts in pending.items() if texts}
    level = 0
    while pending:
        owners, requests = [], []
        for g, texts in pending.items():
            for chunk in packed(runtime, texts, room, aggregation.fan_in, level):
                owners.append(g)
                requests.append(Request((head, *chunk, cue), runtime.yes_no))
        outputs: dict[int, list[str]] = {}
        for g, tokens in zip(owners, runtime.generate(requests, decoding, work)):
            outputs.setdefault(g, []).append(decoding.cut(runtime.tokenizer.decode(tokens)))
        pending = {}
        for g, texts in outputs.items():
            if len(texts) == 1:
                answers[g] = texts[0]
            else:
                pending[g] = texts
        level += 1
    return answers


def packed(runtime: Runtime, texts: Sequence[str], room: int, fan_in: int | None, level: int) -> list[list[Segment]]:
    """The texts in order as prompts' documents: each prompt as many as fit `room` tokens (at most `fan_in`),
    at least two where there are two (InvalidArgument for a text that cannot share a prompt: at the first
    level, longer than the room alone; later, with another answer)."""
    chunks: list[list[Segment]] = [[]]
    used = 0
    for text in texts:
        full = len(chunks[-1]) == fan_in
        (document,) = runtime.segments([runtime.layout.document(0 if full else len(chunks[-1]), text)])
        if full or (chunks[-1] and used + len(document) > room):
            chunks.append([])
            used = 0
            (document,) = runtime.segments([runtime.layout.document(0, text)])
        limit = room if level == 0 else room // 2
        if len(document) > limit:
            raise InvalidArgument(f"a text to aggregate has {len(document):,} tokens; with the answer's tokens the "
                                  f"model {runtime.model_id} takes {limit:,}" + (
                                      "" if level == 0 else " two answers at a time: allow fewer max_tokens"))
        chunks[-1].append(document)
        used += len(document)
    return chunks
