"""AI_COMPLETE's operator (BigQuery's AI.GENERATE, AI_EXTRACT): each row's prompt continued in free text.

- Decoded as the call's options say (`Generation`: max tokens, stop texts, temperature, a JSON schema).
- Rows with the same prompt are answered once; asked in a call of its own (not shared).
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from quail.engine.ai.asking import Question, prompts
from quail.engine.ai.operator import Alone, Call
from quail.engine.ai.options import Generation
from quail.engine.errors import InvalidArgument
from quail.engine.runtime.decode import Decoding
from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.runtime import Runtime


def decoding(generation: Generation, runtime: Runtime) -> Decoding:
    """How the runtime decodes these answers (InvalidArgument when the query names another model)."""
    if generation.model is not None and generation.model.lower() not in runtime.names:
        raise InvalidArgument(f"model {generation.model!r} is not served here: this server serves "
                              f"{runtime.model_id!r} (name it so, or leave the model out)")
    schema = runtime.schema(generation.schema) if generation.schema is not None else None
    return Decoding(generation.max_tokens, runtime.end_of_turn, generation.stop, generation.temperature,
                    generation.top_p, schema)


def complete(runtime: Runtime, question: Question, args: Sequence[Sequence[str | None]], generation: Generation,
             work: QueryWork | None = None) -> list[str | None]:
    """Each row's answer (None where an argument is NULL) to a question answered in free text (`answers`
    "text"); args holds one column (texts) per PROMPT argument. Rows with the same prompt are answered once
    (their answer is a function of the prompt)."""
    decoded = decoding(generation, runtime)
    present, requests = prompts(runtime, question, args)
    keys = [tuple(s.key for s in r.segments) for r in requests]
    distinct = dict(zip(keys, requests))
    tokens = dict(zip(distinct, runtime.generate(list(distinct.values()), decoded, work)))
    out: list[str | None] = [None] * (len(args[0]) if args else 0)
    for i, key in zip(present, keys):
        out[i] = decoded.cut(runtime.tokenizer.decode(tokens[key]))
    return out


class Complete(Alone):
    """The generated text per row, a VARCHAR (NULL where an argument is NULL)."""

    def answer(self, runtime: Runtime, call: Call, work: QueryWork | None) -> pa.Array:
        return pa.array(complete(runtime, call.question, call.args, call.generation, work), pa.string())


COMPLETE = Complete()
