"""Tokenized texts kept between AI steps and queries: each text tokenized once, within a token bound."""

from __future__ import annotations

import numpy as np

from quail.engine.ai.operators import Question, build_requests
from quail.engine.runtime.requests import Segment
from quail.engine.runtime.text_segments import SegmentCache


def _maker(calls: list[list[str]]):
    def make(texts: list[str]) -> list[Segment]:
        calls.append(list(texts))
        return [Segment.of(np.arange(len(t), dtype=np.int32), "test") for t in texts]
    return make


def test_each_text_is_made_once_and_answers_keep_their_order():
    calls: list[list[str]] = []
    cache = SegmentCache(max_tokens=100)
    first = cache.segments(["ab", "abc", "ab"], _maker(calls))
    assert [len(s) for s in first] == [2, 3, 2] and calls == [["ab", "abc"]], "a repeated text is made once"
    second = cache.segments(["abcd", "abc"], _maker(calls))
    assert calls[-1] == ["abcd"] and second[1] is first[1]
    assert cache.tokens == 9 and len(cache) == 3


def test_the_least_recently_used_go_first_and_oversized_texts_are_not_kept():
    calls: list[list[str]] = []
    cache = SegmentCache(max_tokens=10)
    cache.segments(["aaaa", "bbbb"], _maker(calls))
    cache.segments(["aaaa"], _maker(calls))  # used again: "bbbb" is now the oldest
    cache.segments(["cccc"], _maker(calls))
    assert cache.tokens == 8 and calls == [["aaaa", "bbbb"], ["cccc"]]
    cache.segments(["aaaa", "cccc", "bbbb"], _maker(calls))
    assert calls[-1] == ["bbbb"], "only the evicted text is made again"
    cache.segments(["x" * 11], _maker(calls))
    assert len(cache) == 2 and cache.tokens == 8, "a text over the bound is not kept"


def test_later_steps_over_the_same_documents_do_not_tokenize_them_again(runtime, monkeypatch):
    documents = [[f"Review {i}: the soup was {'hot' if i % 2 else 'cold'} and the staff kind."] for i in range(5)]
    first = build_requests(runtime, Question("Is {0} positive?"), documents)
    encoded: list[list[str]] = []
    encode = type(runtime.tokenizer).encode_batch

    def counting(self, texts):
        encoded.append(list(texts))
        return encode(self, texts)

    monkeypatch.setattr(type(runtime.tokenizer), "encode_batch", counting)
    again = build_requests(runtime, Question("Does {0} mention the staff?"), documents)
    assert all(doc[0] not in batch for batch in encoded for doc in documents), "documents came from the cache"
    assert [r.segments[1] for r in again] == [r.segments[1] for r in first]
