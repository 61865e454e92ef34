"""AI operators: turn rows into model requests through the prompt layout, and answers into rows."""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from .requests import Request
from .runtime import Runtime
from .work import QueryWork


def filter_requests(runtime: Runtime, template: str, docs: Sequence[Sequence[str]]) -> list[Request]:
    """One yes/no request per row; docs[i] holds that row's PROMPT arguments as text."""
    layout = runtime.layout
    preamble, question, cue = runtime.segments([layout.preamble(), layout.question(template), layout.answer_cue()])
    width = len(docs[0]) if docs else 0
    texts = [layout.document(k, row[k]) for row in docs for k in range(width)]
    doc_segments = runtime.segments(texts)
    return [
        Request((preamble, *doc_segments[i * width : (i + 1) * width], question, cue), runtime.yes_no)
        for i in range(len(docs))
    ]


def hash_decision(request: Request, selectivity: float) -> float:
    """1.0 for a `selectivity` fraction of prompts, by content hash: decisions for random weights."""
    digest = hashlib.blake2b(b"".join(s.key for s in request.segments), digest_size=8).digest()
    return 1.0 if int.from_bytes(digest, "little") < selectivity * 2**64 else 0.0


def filter_probabilities(runtime: Runtime, template: str, args: Sequence[Sequence[str | None]],
                         work: QueryWork | None = None, selectivity: float = 0.2) -> np.ndarray:
    """P(true) per row; args holds one column (list of texts) per PROMPT argument.

    A row with a NULL argument gets NaN: SQL's unknown, which no filter keeps.
    When the runtime decides by hash (random weights), the forward pass still
    runs in full and the answer is `hash_decision` at the stated selectivity.
    """
    rows = len(args[0]) if args else 0
    present = [i for i in range(rows) if all(col[i] is not None for col in args)]
    requests = filter_requests(runtime, template, [[col[i] for col in args] for i in present])
    probs = np.full(rows, np.nan)
    for i, request, logp in zip(present, requests, runtime.score(requests, work)):
        probs[i] = hash_decision(request, selectivity) if runtime.decisions == "hash" else float(np.exp(logp[1]))
    return probs
