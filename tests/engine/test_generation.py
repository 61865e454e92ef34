"""Greedy generation on the runtime (engine/runtime/decode.py) against HF transformers' `generate` on the same
token ids: the same tokens for 32 chat prompts, batched and one at a time; stop tokens end each sequence where
HF's end."""

from __future__ import annotations

import pytest

from quail.engine.runtime.query_work import QueryWork
from quail.engine.runtime.requests import Request, Segment

SYSTEM = "<|im_start|>system\nYou are a concise assistant. Answer in one short sentence.<|im_end|>\n"
SUBJECTS = ["the sea", "a red bicycle", "winter mornings", "why bread rises", "the moon", "a library at night",
            "how bees talk", "an old map", "rain on a tin roof", "the first computer", "a lighthouse keeper",
            "why the sky is blue", "a cup of tea", "volcanoes", "the smell of pine", "a chess opening",
            "paper airplanes", "a quiet train station", "how rivers form", "a jazz trio", "snow leopards",
            "the printing press", "a garden in May", "why cats purr", "a thunderstorm", "the Roman roads",
            "a violin maker", "how glass is made", "desert nights", "a market in the morning", "owls",
            "the history of the spoon, in the style of a museum guide who loves long words"]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def chats(runtime):
    """32 chat prompts of different lengths after one shared system prompt (a segment of its own)."""
    system = Segment.of(runtime.tokenizer.encode(SYSTEM), runtime.model_id)
    turns = [f"<|im_start|>user\nTell me about {subject}.<|im_end|>\n<|im_start|>assistant\n" for subject in SUBJECTS]
    return [Request((system, Segment.of(runtime.tokenizer.encode(turn), runtime.model_id)), runtime.yes_no)
            for turn in turns]


def hf_greedy(hf_model, request: Request, max_tokens: int, stop: frozenset[int]) -> list[int]:
    """HF's greedy continuation of the request's token ids, cut before its first stop token."""
    import torch

    ids = torch.from_numpy(request.ids().astype("int64"))[None]
    with torch.inference_mode():
        out = hf_model.generate(ids, max_new_tokens=max_tokens, do_sample=False, eos_token_id=sorted(stop),
                                pad_token_id=0)[0, ids.shape[1]:].tolist()
    return out[:next((i for i, token in enumerate(out) if token in stop), len(out))]


def test_greedy_tokens_equal_hf_generate_batched_and_alone(runtime, chats, hf_model):
    stop = frozenset(runtime.tokenizer.encode("<|im_end|>").tolist())
    expected = [hf_greedy(hf_model, request, MAX_TOKENS, stop) for request in chats]
    work = QueryWork()
    batched = runtime.generate(chats, MAX_TOKENS, stop, work)
    assert batched == expected
    assert all(len(tokens) == MAX_TOKENS for tokens in batched), "none stops early: every step is compared"
    fed = sum(len(tokens) - 1 for tokens in batched)  # each token but the last is computed after its sequence
    assert work.stats.fresh_tokens == work.stats.planned_tokens + fed, "the prompts as the tree strategy plans them"
    assert work.stats.planned_tokens < sum(len(r) for r in chats) - 30 * len(chats[0].segments[0]), \
        "the system prompt computed once"
    assert work.stats.generated_tokens == len(chats) * MAX_TOKENS
    runtime.runner.tree.clear()
    alone = [runtime.generate([request], MAX_TOKENS, stop) for request in chats]
    assert [tokens for [tokens] in alone] == expected


def test_a_stop_token_ends_its_sequence_and_the_others_go_on(runtime, chats, hf_model):
    period = frozenset(runtime.tokenizer.encode(".").tolist())
    requests = chats[:6]
    ours = runtime.generate(requests, 20, period)
    assert ours == [hf_greedy(hf_model, request, 20, period) for request in requests]
    lengths = {len(tokens) for tokens in ours}
    assert min(lengths) < 20 and len(lengths) > 1, "sequences end at their own first period"


def test_a_prompt_with_its_tokens_to_generate_past_the_context_is_refused(runtime, chats):
    from quail.engine.errors import InvalidArgument

    room = runtime.config.max_position - len(chats[-1])
    with pytest.raises(InvalidArgument, match="to generate; the model .* reads at most"):
        runtime.generate(chats, room + 1)
