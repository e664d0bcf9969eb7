"""The engine's contract: limits, truncation, prefix reuse, cancellation, end of sequence, stops, logprobs."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from plugd.runner.generate import Engine, fit_context

PROMPT = np.random.default_rng(11).integers(0, 480, 64).tolist()


def tokens_of(events) -> list[int]:
    return [event.token for event in events]


def test_num_predict_ends_with_length(engine, complete):
    events, done = complete(engine, PROMPT[:20], num_predict=5)
    assert len(events) == 5 and done.done_reason == "length" and not done.context_full
    assert (done.prompt_tokens, done.prompt_eval_count, done.eval_count) == (20, 20, 5)
    assert done.prompt_eval_duration > 0 and done.eval_duration > 0


def test_a_full_context_ends_with_length(engine, complete):
    events, done = complete(engine, PROMPT[:20], num_predict=-1, num_ctx=26)
    assert len(events) == 6 and done.done_reason == "length" and done.context_full
    events, done = complete(engine, PROMPT[:20], num_predict=50, num_ctx=26)
    assert len(events) == 6 and done.context_full


def test_fit_context_keeps_the_head_and_the_most_recent_tokens():
    tokens = list(range(40))
    assert fit_context(tokens, num_ctx=64, num_keep=4) == tokens
    assert fit_context(tokens, num_ctx=16, num_keep=4) == [0, 1, 2, 3, *range(29, 40)]
    assert fit_context(tokens, num_ctx=16, num_keep=100) == [*range(14), 39]
    assert fit_context(tokens, num_ctx=16, num_keep=0) == list(range(25, 40))


def test_a_long_prompt_is_truncated_and_still_generates(engine, complete, qwen3_model, tokenizer):
    events, done = complete(engine, PROMPT[:40], num_ctx=16, num_keep=4, num_predict=-1)
    assert done.prompt_tokens == 15 and len(events) == 1 and done.done_reason == "length"
    cold, _ = complete(Engine(qwen3_model, tokenizer), PROMPT[:4] + PROMPT[29:40], num_predict=1)
    assert tokens_of(events) == tokens_of(cold)


def test_a_longer_prompt_reuses_the_cached_prefix(engine, complete, qwen3_model, tokenizer):
    complete(engine, PROMPT[:40], num_predict=4)
    events, done = complete(engine, PROMPT, num_predict=12)
    assert done.prompt_eval_count == 24 and done.prompt_tokens == 64
    cold, cold_done = complete(Engine(qwen3_model, tokenizer), PROMPT, num_predict=12)
    assert cold_done.prompt_eval_count == 64
    assert tokens_of(events) == tokens_of(cold)


def test_a_follow_up_turn_pays_only_for_its_new_tokens(engine, complete, qwen3_model, tokenizer):
    first, _ = complete(engine, PROMPT[:30], num_predict=8)
    follow_up = PROMPT[:30] + tokens_of(first) + PROMPT[30:50]
    events, done = complete(engine, follow_up, num_predict=8)
    # The last generated token was never fed back to the model, so it is evaluated with the new ones.
    assert done.prompt_eval_count == 20 + 1
    cold, _ = complete(Engine(qwen3_model, tokenizer), follow_up, num_predict=8)
    assert tokens_of(events) == tokens_of(cold)


def test_the_same_prompt_again_evaluates_only_its_last_token(engine, complete):
    first, _ = complete(engine, PROMPT[:30])
    again, done = complete(engine, PROMPT[:30])
    assert done.prompt_eval_count == 1 and tokens_of(again) == tokens_of(first)


def test_a_diverging_prompt_rewinds_to_the_common_prefix(engine, complete, qwen3_model, tokenizer):
    complete(engine, PROMPT[:50])
    diverged = PROMPT[:20] + PROMPT[40:60]
    events, done = complete(engine, diverged)
    assert done.prompt_eval_count == 20
    cold, _ = complete(Engine(qwen3_model, tokenizer), diverged)
    assert tokens_of(events) == tokens_of(cold)


def cancel_after(calls: int):
    """A `cancelled` callback that starts answering True on its `calls`+1-th call."""
    count = iter(range(10**6))
    return lambda: next(count) >= calls


def test_cancelling_mid_prefill_keeps_what_was_computed(engine, complete, qwen3_model, tokenizer):
    events, done = complete(engine, PROMPT, cancelled=cancel_after(2))  # prefill_chunk is 8
    assert events == [] and done.done_reason == "cancel"
    assert done.prompt_eval_count == 16 and done.eval_count == 0
    retry, retry_done = complete(engine, PROMPT)
    assert retry_done.prompt_eval_count == 64 - 16
    cold, _ = complete(Engine(qwen3_model, tokenizer), PROMPT)
    assert tokens_of(retry) == tokens_of(cold)


def test_cancelling_mid_decode_stops_at_the_next_step(engine, complete, make_request, qwen3_model, tokenizer):
    cancelled = False
    received = []
    for event in engine.complete(make_request(PROMPT[:30], num_predict=40), lambda: cancelled):  # noqa: B023
        received.append(event)
        cancelled = len(received) == 5
    *events, done = received
    assert len(events) == 5 and done.done_reason == "cancel" and done.eval_count == 5
    follow_up = PROMPT[:30] + tokens_of(events) + PROMPT[30:40]
    after, after_done = complete(engine, follow_up)
    # Token 6 was already dispatched when the cancel came, so all five tokens shown are in the cache.
    assert after_done.prompt_eval_count == 10
    cold, _ = complete(Engine(qwen3_model, tokenizer), follow_up)
    assert tokens_of(after) == tokens_of(cold)


def test_caches_grow_with_use_not_to_the_whole_context_at_once(engine, complete):
    """A decoding row is sized for its prompt and (a bounded share of) its output when it joins the batch, so
    decoding does not reallocate; never for the whole context at once."""

    def decoding(**fields) -> list[mx.array]:
        """The first layer's key buffer of the batch at every decode step of a completion of PROMPT[:30]."""
        seen = []

        def watch() -> bool:
            if engine.batch.layers:
                seen.append(engine.batch.layers[0].keys)
            return len(seen) > 3 and fields["num_predict"] < 0

        complete(engine, PROMPT[:30], cancelled=watch, num_ctx=32768, **fields)
        return seen

    assert {keys.shape[2] for keys in decoding(num_predict=2)} == {256}  # one step for 32 positions, not 32,768
    buffers = decoding(num_predict=700)
    assert {keys.shape[2] for keys in buffers} == {768}  # sized for prompt and output (730 positions) at once
    assert all(keys is buffers[0] for keys in buffers), "reallocated within room"
    unbounded = decoding(num_predict=-1)
    assert {keys.shape[2] for keys in unbounded} == {4352}  # no bound: 4,096 positions of output to start with


def test_the_prefill_reports_its_start_and_each_chunk(engine, make_request):
    reported = []
    list(engine.complete(make_request(PROMPT[:30], num_predict=1), lambda: False, progress=reported.append))
    assert [(e.prompt_tokens, e.cached_tokens, e.evaluated) for e in reported] == [
        (30, 0, 0), (30, 0, 8), (30, 0, 16), (30, 0, 24), (30, 0, 29)]  # the last prompt token starts the decode
    reported.clear()
    list(engine.complete(make_request(PROMPT[:40], num_predict=1), lambda: False, progress=reported.append))
    assert [(e.cached_tokens, e.evaluated) for e in reported] == [(30, 0), (30, 8), (30, 9)]
