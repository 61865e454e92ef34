"""AI_AGG and AI_SUMMARIZE_AGG: each group's texts reduced by the model, against the reduction tree computed directly.

The independent side lays each prompt out from the documented layout
([preamble + Task: instruction][Text 1]...[Text k][answer cue], engine/ai/aggregate.py)
and generates it alone; grouping, ordering and NULLs are checked against plain Python.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

import quail
from quail.engine.ai.aggregate import aggregate, packed
from quail.engine.ai.options import SUMMARIZE, Aggregation, Generation
from quail.engine.errors import InvalidArgument, Unimplemented
from quail.engine.runtime.decode import Decoding
from quail.engine.runtime.requests import Request, Segment

SMALL_MODEL = True  # what these tests check holds for any model's arithmetic (tests/small_model.py)

REVIEWS = pa.table({"id": list(range(9)),
                    "product": ["kettle", "kettle", "lamp", "lamp", "lamp", "kettle", "tent", "tent", None],
                    "body": ["Leaks from the lid.", "Boils fast, but loud.", "Too dim for reading.",
                             "Flickers at night.", None, "Handle got hot.", None, None, "No product named."]})
LIST_THEM = "List the complaints in these reviews."


@pytest.fixture(scope="module")
def session(runtime):
    made = quail.Session(runtime=runtime.variant("quail"))
    made.register("reviews", REVIEWS)
    return made


def directly(runtime, instruction: str, texts: list[str], max_tokens: int, fan_in: int) -> str:
    """The reduction tree of the texts, prompt by prompt: fan_in texts a prompt, level by level."""
    layout, decoding = runtime.layout, Decoding(max_tokens, runtime.end_of_turn)

    def answer(chunk: list[str]) -> str:
        parts = [layout.preamble() + layout.task(instruction) + "\n\n",
                 *(layout.document(k, text) for k, text in enumerate(chunk)), layout.answer_cue()]
        request = Request(tuple(Segment.of(runtime.tokenizer.encode(p), runtime.model_id) for p in parts),
                          runtime.yes_no)
        (tokens,) = runtime.generate([request], decoding)
        return runtime.tokenizer.decode(tokens)

    while len(texts) > 1:
        texts = [answer(texts[i:i + fan_in]) for i in range(0, len(texts), fan_in)]
        if len(texts) == 1:
            return texts[0]
    return answer(texts)


def test_each_group_gets_its_reduction_tree(runtime):
    """Five texts, two a prompt: three answers, then two, then one; a group of one text is one prompt; a group
    of none (NULLs) is NULL."""
    texts = ["The lid leaks.", "It boils fast but is loud.", "The handle gets hot.", "It rusted in a month.",
             "The cord is too short."]
    aggregation = Aggregation(LIST_THEM, Generation(max_tokens=8), fan_in=2)
    got = aggregate(runtime, aggregation, [texts, ["Too dim."], [None, None], None])
    assert got == [directly(runtime, LIST_THEM, texts, 8, 2), directly(runtime, LIST_THEM, ["Too dim."], 8, 2),
                   None, None]


def test_prompts_take_as_many_texts_as_fit_the_room(runtime):
    texts = [f"Review {i}: " + "very " * (i % 5) + "bad." for i in range(12)]
    chunks = packed(runtime, texts, 60, None, 0)
    assert sum(len(chunk) for chunk in chunks) == 12 and len(chunks) > 1
    assert all(sum(len(s) for s in chunk) <= 60 for chunk in chunks)
    assert all(sum(len(s) for s in chunk) + len(following[0]) > 60 for chunk, following in zip(chunks, chunks[1:])), \
        "a prompt is cut only where the next text does not fit"
    with pytest.raises(InvalidArgument, match="to aggregate has"):
        packed(runtime, ["word " * 200], 60, None, 0)


def test_ai_agg_over_groups_in_sql(session, runtime):
    sql = (f"SELECT product, count(*) AS n, AI_AGG(body, '{LIST_THEM}', {{'max_tokens': 12}}) AS complaints "
           "FROM reviews WHERE product IS NOT NULL GROUP BY product ORDER BY product")
    result = session.sql(sql).run()
    got = result.table.to_pylist()
    groups = {}
    for row in REVIEWS.to_pylist():
        if row["product"] is not None:
            groups.setdefault(row["product"], []).append(row["body"])
    want = [{"product": p, "n": len(bodies),
             "complaints": directly(runtime, LIST_THEM, sorted(b for b in bodies if b is not None), 12, 64)
             if any(bodies) else None} for p, bodies in sorted(groups.items())]
    assert got == want
    assert result.report.requests == 2, "one prompt per group with texts"


def test_summarize_agg_after_a_limit(session, runtime):
    sql = ("SELECT product, AI_SUMMARIZE_AGG(body, {'max_tokens': 16}) AS s FROM reviews GROUP BY product "
           "ORDER BY product LIMIT 1")
    result = session.sql(sql).run()
    assert result.table.to_pylist() == [
        {"product": "kettle", "s": directly(runtime, SUMMARIZE, sorted(["Leaks from the lid.", "Boils fast, but loud.",
                                                                         "Handle got hot."]), 16, 64)}]
    assert result.report.requests == 1, "only the group returned is summarized"


def test_ai_aggregates_take_generation_options(session):
    """An options object after the instruction (AI_AGG) or the texts (AI_SUMMARIZE_AGG), as AI_COMPLETE's:
    max_tokens bounds every answer of the tree; a stop text cuts it; in both dialects that parse it."""
    short = session.sql(f"SELECT product, AI_AGG(body, '{LIST_THEM}', {{'max_tokens': 3}}) AS c FROM reviews "
                        "WHERE product = 'lamp' GROUP BY product").run()
    assert short.report.generated_tokens <= 3 and short.table.num_rows == 1
    summary = session.sql("SELECT AI_SUMMARIZE_AGG(body, {'max_tokens': 4, 'stop': ['.']}) AS s FROM reviews "
                          "WHERE product = 'kettle'").run()  # a whole table's aggregate: one group
    assert summary.report.generated_tokens <= 4 and "." not in summary.table["s"][0].as_py()
    nothing = session.sql("SELECT AI_SUMMARIZE_AGG(body) AS s FROM reviews WHERE product = 'none'").run()
    assert nothing.table.to_pylist() == [{"s": None}] and nothing.report.requests == 0, "no texts: NULL, unasked"
    duck = session.sql(f"SELECT AI_AGG(body, '{LIST_THEM}', {{'max_tokens': 3}}) AS c FROM reviews "
                       "WHERE product = 'lamp'", dialect="duckdb").run()
    assert duck.table["c"].to_pylist() == short.table["c"].to_pylist()


@pytest.mark.parametrize("sql, error, message", [
    (f"SELECT upper(AI_AGG(body, '{LIST_THEM}')) FROM reviews", InvalidArgument, "column of the SELECT by itself"),
    (f"SELECT product, AI_AGG(body, '{LIST_THEM}') AS c FROM reviews GROUP BY product ORDER BY c", InvalidArgument,
     "ORDER cannot read"),
    (f"SELECT id FROM reviews WHERE AI_AGG(body, '{LIST_THEM}') = 'x'", InvalidArgument,
     "column of the SELECT by itself"),
    ("SELECT AI_AGG(body, product) FROM reviews", InvalidArgument, "instruction must be a string literal"),
    (f"SELECT AI_AGG(body, '{LIST_THEM}', {{'max_token': 3}}) FROM reviews", InvalidArgument, "no option 'max_token'"),
    ("SELECT AI_SUMMARIZE_AGG(body, {'response_format': {'type': 'object'}}) FROM reviews", InvalidArgument,
     "takes no response_format"),
    (f"SELECT AI_AGG(body, '{LIST_THEM}', {{'max_tokens': 0}}) FROM reviews", InvalidArgument, "at least 1"),
], ids=["in-expression", "ordered-by", "in-where", "instruction", "unknown-option", "response-format", "zero"])
def test_misplaced_ai_aggregates_are_refused(session, sql, error, message):
    with pytest.raises(error, match=message):
        session.sql(sql).run()


def test_substrait_export_refuses_ai_aggregates(session):
    with pytest.raises(Unimplemented, match="AI aggregates"):
        session.substrait(f"SELECT product, AI_AGG(body, '{LIST_THEM}') AS c FROM reviews GROUP BY product")
