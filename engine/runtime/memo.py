"""What one query computed that a later one over the same rows may reuse: a small map the runtime keeps.

- Keyed by bytes its user derives from everything the value depends on (a cascade: its question and its
  rows' documents, so a changed table finds nothing).
- At most `entries` values; the least recently used goes first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, TypeVar

T = TypeVar("T")
MEMO_ENTRIES = 32


class Memo:
    """A bounded map, least recently used dropped first, safe to share between queries' threads."""

    def __init__(self, entries: int = MEMO_ENTRIES) -> None:
        self.entries = entries
        self._kept: OrderedDict[bytes, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: bytes, make: Callable[[], T]) -> T:
        """The value kept under `key`, else `make()`'s, kept there from now on.

        >>> memo = Memo(entries=1)
        >>> memo.get(b"a", list).append(1); memo.get(b"a", list)
        [1]
        >>> memo.get(b"b", list), memo.get(b"a", list)
        ([], [])
        """
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
            value = self._kept[key] = make()
            while len(self._kept) > self.entries:
                self._kept.popitem(last=False)
            return value

    def clear(self) -> None:
        """Forget everything (a benchmark's run that must compute its own)."""
        with self._lock:
            self._kept.clear()
