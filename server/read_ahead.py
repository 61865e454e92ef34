"""A generator's items made on a thread ahead of their reader, so that sending one overlaps making the next."""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Executor, Future
from typing import Generator, Generic, Iterator, TypeVar

T = TypeVar("T")


class ReadAhead(Generic[T]):
    """The items of a generator, made on a thread ahead of the reader.

    The items of `items`, made on a thread of `pool` from now on, at most `depth` of them made and not yet
    taken by the reader, the one being made counted: the first (or the end, where there is none) is made
    before anyone reads, each next one while the reader sends the last it took, and nothing past the first
    without a reader. After the last item, the generator's own end (a query's report) runs while the reader
    sends that item.

    The reader gets the items in order, then the generator's error if it raised one. `first` is done once
    the first item, the end or the error is there to read (or the making stopped). `close()` (any thread,
    any time, more than once) stops the making: the generator is closed on its own thread once its current
    item is made, what was made and not read is dropped, and a read after it finds no more items. The
    reader's loop ending, however it ends, closes it. No reference cycle runs through an error: what its
    frames hold (a query's KV) goes as soon as no one holds the error.
    """

    def __init__(self, items: Generator[T, None, None], pool: Executor, depth: int = 1) -> None:
        self._items, self._depth = items, depth
        self._made: deque[tuple[T | None, BaseException | None, bool]] = deque()  # item, error, end
        self._changed = threading.Condition()
        self._closed = False
        self.first: Future = Future()
        pool.submit(self._make)

    def __iter__(self) -> Iterator[T]:
        try:
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self._made or self._closed)
                    if self._closed:
                        return
                    item, error, end = self._made.popleft()
                    self._changed.notify_all()
                if error is not None:
                    try:
                        raise error
                    finally:  # the error's traceback holds this frame: no cycle through it
                        error = None
                if end:
                    return
                yield item
        finally:
            self.close()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._made.clear()  # unread items, or an error whose traceback holds this object (a cycle)
            self._changed.notify_all()

    def _make(self) -> None:
        try:
            while self._room():
                try:
                    item = next(self._items)
                except StopIteration:
                    self._hand(None, None, True)
                    return
                self._hand(item, None, False)
        except BaseException as err:  # the reader raises it, as if it had made the item itself
            self._hand(None, err, True)
        finally:
            self._items.close()
            if not self.first.done():
                self.first.set_result(None)

    def _room(self) -> bool:
        """Wait until fewer than `depth` items wait for the reader; False once closed."""
        with self._changed:
            self._changed.wait_for(lambda: len(self._made) < self._depth or self._closed)
            return not self._closed

    def _hand(self, item: T | None, error: BaseException | None, end: bool) -> None:
        with self._changed:
            if self._closed:
                return
            self._made.append((item, error, end))
            self._changed.notify_all()
        if not self.first.done():
            self.first.set_result(None)
