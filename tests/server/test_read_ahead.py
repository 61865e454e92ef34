"""Items made ahead of their reader: in order, errors where they happened, bounded, and stopped by close.
(The ADBC tests run every prepared query's batches through it: its head start.)"""

from __future__ import annotations

import gc
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest

from quail.server.read_ahead import ReadAhead

WAIT_S = 10.0


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as executor:
        yield executor


def test_the_reader_gets_every_item_in_order_and_the_end_is_made_before_it_reads_the_last(pool):
    ended, sent = threading.Event(), []

    def items() -> Iterator[int]:
        yield from range(5)
        ended.set()  # a query's report, after its last batch

    ahead = ReadAhead(items(), pool)
    assert ahead.first.result(WAIT_S) is None
    for item in ahead:
        if item == 4:
            assert ended.wait(WAIT_S), "the generator's end runs while the last item is being sent"
        sent.append(item)
    assert sent == [0, 1, 2, 3, 4]


def test_an_error_reaches_the_reader_after_the_items_made_before_it(pool):
    def items() -> Iterator[int]:
        yield 1
        raise ValueError("the pass failed")

    read = []
    with pytest.raises(ValueError, match="the pass failed"):
        for item in ReadAhead(items(), pool):
            read.append(item)
    assert read == [1]


def test_the_next_item_is_made_only_once_the_reader_took_the_last(pool):
    made = []

    def items() -> Iterator[int]:
        for i in range(10):
            made.append(i)
            yield i

    ahead = ReadAhead(items(), pool, depth=1)
    assert ahead.first.result(WAIT_S) is None
    assert not _waits_for(lambda: len(made) > 1), "no reader: only the first is made"
    reader = iter(ahead)
    assert next(reader) == 0
    assert _waits_for(lambda: len(made) == 2, WAIT_S), "the second is made while the reader sends the first"
    assert not _waits_for(lambda: len(made) > 2)
    assert list(reader) == list(range(1, 10))


def test_without_a_reader_the_end_is_not_made(pool):
    ended = threading.Event()

    def items() -> Iterator[int]:
        yield 1
        ended.set()  # a query's report: only for a query whose rows someone reads

    ahead = ReadAhead(items(), pool)
    assert ahead.first.result(WAIT_S) is None
    assert not ended.wait(0.2)
    ahead.close()
    assert not ended.wait(0.2)


def test_close_stops_the_making_and_closes_the_generator_on_its_thread(pool):
    closed, release = threading.Event(), threading.Event()

    def items() -> Iterator[int]:
        try:
            yield 1
            release.wait(WAIT_S)
            yield 2
            yield 3
        finally:
            closed.set()  # the query's running entry and admission go

    ahead = ReadAhead(items(), pool)
    reader = iter(ahead)
    assert next(reader) == 1
    ahead.close()
    release.set()
    assert closed.wait(WAIT_S)
    assert next(reader, None) is None, "nothing is read once closed"


def test_a_reader_that_stops_reading_stops_the_making(pool):
    closed = threading.Event()

    def items() -> Iterator[int]:
        try:
            yield from range(1000)
        finally:
            closed.set()

    reader = iter(ReadAhead(items(), pool))
    assert next(reader) == 0
    reader.close()  # the client went: its stream is dropped
    assert closed.wait(WAIT_S)


class _Held:
    """What a query's frames hold (its KV in the pool, say)."""


@pytest.mark.parametrize("read", [True, False], ids=["read", "left unread"])
def test_an_error_read_or_left_unread_leaves_nothing_to_the_garbage_collector(read):
    """A query's error carries its frames and what they hold: neither raising it to the reader nor closing
    before it is read makes a reference cycle, which would keep them until a garbage collection."""
    held: list[weakref.ref] = []

    def items() -> Iterator[int]:
        work = _Held()
        held.append(weakref.ref(work))
        raise ValueError("the query was cancelled")
        yield work

    gc.disable()
    try:
        with ThreadPoolExecutor(1) as one:
            ahead = ReadAhead(items(), one)
            assert ahead.first.result(WAIT_S) is None
            one.submit(lambda: None).result(WAIT_S)  # the making is over
            if read:
                try:
                    list(ahead)
                except ValueError:
                    pass
            else:
                ahead.close()
            del ahead
            assert held[0]() is None
    finally:
        gc.enable()


def test_first_is_done_when_nothing_comes(pool):
    ahead = ReadAhead((item for item in ()), pool)
    assert ahead.first.result(WAIT_S) is None
    assert list(ahead) == []


def _waits_for(condition, seconds: float = 0.2) -> bool:
    """Whether `condition` comes true within `seconds`."""
    done = threading.Event()
    for _ in range(20):
        if condition():
            return True
        done.wait(seconds / 20)
    return condition()
