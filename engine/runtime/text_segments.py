"""Texts tokenized once for every AI step and query: their segments by text, least recently used first out."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

from quail.engine.runtime.requests import Segment


class SegmentCache:
    """Segments of texts already tokenized, within `max_tokens` token ids together.

    A query's later AI steps ask about the same documents as its first (a chain
    of filters, a join anchored on filtered rows), and dashboards ask again:
    each text is tokenized and keyed once, not once per step.
    """

    def __init__(self, max_tokens: int = 1 << 24) -> None:
        self.max_tokens = max_tokens
        self.tokens = 0
        self._entries: OrderedDict[str, Segment] = OrderedDict()
        self._lock = threading.Lock()

    def segments(self, texts: list[str], make: Callable[[list[str]], list[Segment]]) -> list[Segment]:
        """Each text's segment: those kept as they are, the others made by `make` in one batch and kept."""
        distinct = list(dict.fromkeys(texts))
        with self._lock:
            found = {text: self._entries[text] for text in distinct if text in self._entries}
            for text in found:
                self._entries.move_to_end(text)
        missing = [text for text in distinct if text not in found]
        if missing:
            made = dict(zip(missing, make(missing)))
            found.update(made)
            self._keep(made)
        return [found[text] for text in texts]

    def _keep(self, made: dict[str, Segment]) -> None:
        with self._lock:
            for text, segment in made.items():
                if text in self._entries or len(segment) > self.max_tokens:
                    continue
                self._entries[text] = segment
                self.tokens += len(segment)
            while self.tokens > self.max_tokens:
                _, dropped = self._entries.popitem(last=False)
                self.tokens -= len(dropped)

    def __len__(self) -> int:
        return len(self._entries)
