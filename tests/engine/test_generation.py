"""Generation on the runtime (engine/runtime/decode.py) against HF transformers' `generate` on the same token ids:
the same greedy tokens for 32 chat prompts batched, and for four of them one at a time; stop tokens end each
sequence where HF's end; stop texts, and sampling that is a function of the prompt."""

from __future__ import annotations

import pytest

from quail.engine.ai.asking import Question, build_requests
from quail.engine.runtime.decode import Decoding
from quail.engine.runtime.query_work import QueryWork
from tests.sample_tables import SUBJECTS, TELL, TELL_TOKENS

MAX_TOKENS = TELL_TOKENS


@pytest.fixture(scope="module")
def chats(runtime):
    """32 prompts of different lengths as AI_COMPLETE lays them out (the chat template around a shared preamble,
    a subject, and the task), the prompts tests/server/test_server_adbc.py sends through SQL."""
    return build_requests(runtime, Question(TELL, answers="text"), [[subject] for subject in SUBJECTS])


def test_greedy_tokens_equal_hf_generate_batched_and_alone(runtime, chats, hf_generate):
    stop = runtime.end_of_turn
    assert stop == frozenset(runtime.tokenizer.encode("<|im_end|>").tolist()), "SmolLM2's turn ends so"
    expected = hf_generate(chats, MAX_TOKENS, stop)
    work = QueryWork()
    batched = runtime.generate(chats, Decoding(MAX_TOKENS, stop), work)
    assert batched == expected
    assert sum(len(tokens) == MAX_TOKENS for tokens in batched) >= len(chats) // 2, "most run every step"
    assert any(len(tokens) < MAX_TOKENS for tokens in batched), "some end at the turn's end"
    # Each token is computed after its sequence but the last of one stopped by max_tokens (none follows it);
    # a sequence that a stop token ended may have had that token computed too (the host reads a step's tokens
    # after queuing the next step).
    fed = sum(len(tokens) - (len(tokens) == MAX_TOKENS) for tokens in batched)
    stopped = sum(len(tokens) < MAX_TOKENS for tokens in batched)
    assert work.stats.planned_tokens + fed <= work.stats.fresh_tokens <= work.stats.planned_tokens + fed + stopped, \
        "the prompts as the tree strategy plans them"
    assert work.stats.planned_tokens < sum(len(r) for r in chats) - 30 * len(chats[0].segments[0]), \
        "the preamble computed once"
    assert work.stats.generated_tokens == sum(map(len, batched))
    assert work.stats.fresh_tokens == work.stats.planned_tokens + work.stats.decoded_tokens
    assert work.stats.cached_tokens == sum(len(r) for r in chats) - work.stats.planned_tokens > 0, \
        "the prompts' tokens their prefill did not compute"
    runtime.runner.tree.clear()
    # Alone: the shortest and the longest prompt, and the first a stop token ends and the first that runs every
    # step (a decode step of one row costs nearly what one of 32 does on a CPU).
    picked = sorted({min(range(len(chats)), key=lambda i: len(chats[i])),
                     max(range(len(chats)), key=lambda i: len(chats[i])),
                     next(i for i, tokens in enumerate(expected) if len(tokens) < MAX_TOKENS),
                     next(i for i, tokens in enumerate(expected) if len(tokens) == MAX_TOKENS)})
    alone = [runtime.generate([chats[i]], Decoding(MAX_TOKENS, stop)) for i in picked]
    assert [tokens for [tokens] in alone] == [expected[i] for i in picked]


def test_a_stop_token_ends_its_sequence_and_the_others_go_on(runtime, chats, hf_generate):
    period = frozenset(runtime.tokenizer.encode(".").tolist())
    requests = chats[:6]
    ours = runtime.generate(requests, Decoding(20, period))
    assert ours == hf_generate(requests, 20, period)
    lengths = {len(tokens) for tokens in ours}
    assert min(lengths) < 20 and len(lengths) > 1, "sequences end at their own first period"


def test_a_prompt_with_its_tokens_to_generate_past_the_context_is_refused(runtime, chats):
    from quail.engine.errors import InvalidArgument

    room = runtime.config.max_position - len(chats[-1])
    with pytest.raises(InvalidArgument, match="to generate; the model .* reads at most"):
        runtime.generate(chats, Decoding(room + 1))


def test_a_stop_text_ends_a_sequence_and_is_cut_from_its_text(runtime, chats):
    greedy = runtime.generate(chats[:6], Decoding(20))
    texts = [runtime.tokenizer.decode(tokens) for tokens in greedy]
    stop = next(word for word in (" the ", " a ", " is ") if sum(word in t for t in texts) >= 2)
    decoding = Decoding(20, stop_texts=(stop,))
    stopped = runtime.generate(chats[:6], decoding)
    for full, tokens, text in zip(greedy, stopped, texts):
        assert full[:len(tokens)] == tokens, "the same tokens up to the stop"
        assert decoding.cut(runtime.tokenizer.decode(tokens)) == text.split(stop)[0]
        assert len(tokens) < len(full) if stop in text else tokens == full


def test_sampling_is_a_function_of_the_prompt(runtime, chats):
    """Drawn tokens differ from greedy ones but not from run to run, batched or alone; a nucleus of the top
    token alone is greedy."""
    sampled = Decoding(MAX_TOKENS, temperature=1.0)
    batched, greedy = runtime.generate(chats[:4], sampled), runtime.generate(chats[:4], Decoding(MAX_TOKENS))
    assert batched != greedy
    assert [tokens for request in chats[:4] for tokens in runtime.generate([request], sampled)] == batched
    assert runtime.generate(chats[:4], Decoding(MAX_TOKENS, temperature=1.0, top_p=1e-6)) == greedy


def test_sequences_whose_kv_the_pool_cannot_hold_decode_the_same_tokens(runtime, chats, hf_generate):
    """A pool of 40 slots, fewer than one prompt: the prompts' KV is kept outside it, so each sequence
    goes on as one run after another (rows after their runs, not decode steps through slot tables), and
    gives HF's tokens. The tree cannot keep a prompt from its prefill to its decoding, so decoding computes
    it again: counted as decoding's, so no prompt token counts as computed twice (nor cached less than
    none)."""
    from quail.engine.kv.pool import token_bytes
    from quail.engine.runtime.runtime import Runtime

    cfg = runtime.config
    slot = token_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, runtime.runner.model.embed_tokens.weight.dtype)
    small = Runtime(runtime.model_id, runtime.runner.model, runtime.tokenizer, runtime.layout.frame,
                    kv_bytes=40 * slot)
    assert small.runner.pool.slots == 40 and all(len(request) > 40 for request in chats[:3])
    stop = runtime.end_of_turn
    work = QueryWork()
    assert small.generate(chats[:3], Decoding(6, stop), work) == hf_generate(chats[:3], 6, stop)
    prompts = sum(len(r) for r in chats[:3])
    assert work.stats.decoded_tokens > prompts - 40, "the prompts computed again to decode"
    assert work.stats.cached_tokens == prompts - work.stats.planned_tokens >= 0


def test_prompts_more_than_half_the_pool_holds_decode_in_waves_and_give_hf_tokens(runtime, chats, hf_generate):
    """A pool of 400 slots: eight prompts and their answers take more than half of it, so they decode in
    waves of what fits (decode.waves), each after the one before, and give HF's tokens."""
    from quail.engine.kv.pool import token_bytes
    from quail.engine.runtime.decode import waves
    from quail.engine.runtime.runtime import Runtime

    cfg = runtime.config
    slot = token_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, runtime.runner.model.embed_tokens.weight.dtype)
    small = Runtime(runtime.model_id, runtime.runner.model, runtime.tokenizer, runtime.layout.frame,
                    kv_bytes=400 * slot)
    requests = chats[:8]
    assert len(waves([len(r) for r in requests], MAX_TOKENS, small.runner.pool.slots // 2)) >= 3
    stop = runtime.end_of_turn
    work = QueryWork()
    assert small.generate(requests, Decoding(MAX_TOKENS, stop), work) == \
        hf_generate(requests, MAX_TOKENS, stop)
    assert work.stats.generated_tokens > 0
