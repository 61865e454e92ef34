"""A decoder as an embedding model, as Qwen3-Embedding: the final hidden state at a text's last token, normalized.

- The text's tokens end with the end-of-text token (appended where the vocabulary has one).
- Its passes are its runtime's, on the scheduler of that runtime: prefill only, no KV kept (the runtime has
  no pool), rows of several statements packed together, each text computed in full, longest first (the
  naive strategy: the quail strategy's tree of shared prefixes costs the host about twice the time a text
  and saves little over distinct texts when no KV outlives a pass).
- A text longer than the model's context is refused (InvalidArgument) before any pass.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.requests import Request, Segment
from quail.engine.runtime.runtime import Runtime

END_OF_TEXT = "<|endoftext|>"


class DecoderEmbedding:
    """An embedding model on a runtime of its own (see the module)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.name = runtime.model_id
        self.dims = runtime.config.hidden_size
        end = runtime.tokenizer.token_id(END_OF_TEXT)
        self._end = np.array([end] if end is not None else [], dtype=np.int32)

    def tokens(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's token ids, the end-of-text token last (where the vocabulary has one)."""
        return [np.concatenate([ids, self._end]) for ids in self.runtime.tokenizer.encode_batch(texts)]

    def embed_ids(self, rows: list[np.ndarray], stop: Callable[[], None] | None = None) -> list[np.ndarray | None]:
        """The embedding of each text of these token ids (None: no tokens), the rows computed together; `stop`
        (raising to stop: the statement's check) runs before each pass."""
        present = [k for k, ids in enumerate(rows) if len(ids)]
        requests = [Request((Segment.of(rows[k], self.name),), self.runtime.yes_no) for k in present]
        out: list[np.ndarray | None] = [None] * len(rows)
        if requests:
            hidden = torch.stack(self.runtime.hidden(requests, QueryWork(stops_with=stop))).float()
            vectors = torch.nn.functional.normalize(hidden, dim=-1).cpu().numpy()
            for k, vector in zip(present, vectors):
                out[k] = vector
        return out
