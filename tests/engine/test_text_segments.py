"""Tokenized texts kept between AI steps and queries: each text tokenized once, within a token bound."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from quail.engine.ai.asking import Question, build_requests
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


def _counting_encodes(runtime, monkeypatch) -> list[list[str]]:
    """The batches the runtime's tokenizer encodes from now on."""
    encoded: list[list[str]] = []
    encode = type(runtime.tokenizer).encode_batch

    def counting(self, texts):
        encoded.append(list(texts))
        return encode(self, texts)

    monkeypatch.setattr(type(runtime.tokenizer), "encode_batch", counting)
    return encoded


def test_later_steps_over_the_same_documents_do_not_tokenize_them_again(runtime, monkeypatch):
    documents = [[f"Review {i}: the soup was {'hot' if i % 2 else 'cold'} and the staff kind."] for i in range(5)]
    first = build_requests(runtime, Question("Is {0} positive?"), documents)
    encoded = _counting_encodes(runtime, monkeypatch)
    again = build_requests(runtime, Question("Does {0} mention the staff?"), documents)
    assert all(doc[0] not in batch for batch in encoded for doc in documents), "documents came from the cache"
    assert [r.segments[1] for r in again] == [r.segments[1] for r in first]


def test_a_warmed_column_is_tokenized_once_as_its_queries_tokenize_its_documents(runtime, monkeypatch):
    """Runtime.warm tokenizes texts as the documents of placeholder {0} into the texts cache: a query's requests
    over them take those segments, the same token ids as tokenizing each document laid out; nothing is
    warmed while the cache is half full."""
    monkeypatch.setattr(runtime, "texts", SegmentCache())
    column = pa.chunked_array([[f"Review {i}: the pie was {'warm' if i % 3 else 'stale'}." for i in range(6)],
                               [None, "Review 6: fine."]])
    added = runtime.warm(column)
    assert added == runtime.texts.tokens > 0 and len(runtime.texts) == 7
    encoded = _counting_encodes(runtime, monkeypatch)
    texts = [t for t in column.to_pylist() if t is not None]
    requests = build_requests(runtime, Question("Is {0} about pie?"), [[t] for t in texts])
    assert all(runtime.layout.document(0, t) not in batch for batch in encoded for t in texts)
    for request, text in zip(requests, texts):
        assert request.segments[1].ids.tolist() == list(runtime.tokenizer.encode(runtime.layout.document(0, text)))
    monkeypatch.setattr(runtime, "texts", SegmentCache(max_tokens=2 * added))
    assert runtime.warm(column) == added and runtime.warm(pa.array(["Review 7: more pie."])) == 0
