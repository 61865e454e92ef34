"""The runtime: owns the model, tokenizer and prompt layout, and scores requests from every query."""

from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

from .model import Decoder
from .prompt import FALSE_SPELLINGS, TRUE_SPELLINGS, ChatFrame, FilterLayout
from .requests import LabelSet, Request, Segment
from .runner import ModelRunner
from .tokenizer import Tokenizer


class Runtime:
    """One per device: forward passes run one at a time, whichever query asks."""

    def __init__(self, model_id: str, model: Decoder, tokenizer: Tokenizer, frame: ChatFrame) -> None:
        self.model_id = model_id
        self.config = model.config
        self.tokenizer = tokenizer
        self.layout = FilterLayout(frame)
        self.runner = ModelRunner(model)
        self.yes_no = self._yes_no_labels()
        self._lock = threading.Lock()

    def segments(self, texts: list[str]) -> list[Segment]:
        """Tokenize each text as a segment of its own."""
        return [Segment.of(ids, self.model_id) for ids in self.tokenizer.encode_batch(texts)]

    def score(self, requests: Sequence[Request]) -> list[np.ndarray]:
        """Per-answer log-probabilities of each request (answer order = its label set's names)."""
        if not requests:
            return []
        with self._lock:
            return self.runner.score(requests)

    def _single_token(self, spellings: tuple[str, ...]) -> list[int]:
        ids = [self.tokenizer.encode(s) for s in spellings]
        return list(dict.fromkeys(int(t[0]) for t in ids if len(t) == 1))

    def _yes_no_labels(self) -> LabelSet:
        false_ids, true_ids = self._single_token(FALSE_SPELLINGS), self._single_token(TRUE_SPELLINGS)
        if not false_ids or not true_ids:
            raise ValueError("the tokenizer spells neither Yes nor No as a single token")
        return LabelSet(("false", "true"), tuple(false_ids + true_ids), (0,) * len(false_ids) + (1,) * len(true_ids))
