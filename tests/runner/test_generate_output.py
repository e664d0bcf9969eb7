"""What a completion emits: text, end of sequence, stop strings, log-probabilities, buffer release."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from plugd.runner.generate import Engine
from plugd.tokenizer import Tokenizer

PROMPT = np.random.default_rng(5).integers(0, 480, 24).tolist()


def text_of(events, done) -> str:
    return "".join(event.text for event in events) + done.text


def test_generated_text_is_the_decoded_tokens(engine, complete, tokenizer):
    events, done = complete(engine, PROMPT, num_predict=24)
    assert text_of(events, done) == tokenizer.decode([event.token for event in events])


def test_an_end_of_sequence_token_stops_without_text(engine, checkpoints, qwen3_model, complete):
    events, _ = complete(engine, PROMPT, num_predict=8)
    tokenizer = Tokenizer.from_dir(checkpoints["qwen3"])  # a copy whose end of sequence is a token greedy picks
    tokenizer.eos_ids = frozenset({events[5].token})
    first = next(i for i, event in enumerate(events) if event.token == events[5].token)
    stopped, done = complete(Engine(qwen3_model, tokenizer), PROMPT, num_predict=8)
    assert [event.token for event in stopped] == [event.token for event in events[:first]]
    assert done.done_reason == "stop" and done.eval_count == first + 1
    assert text_of(stopped, done) == tokenizer.decode([event.token for event in events[:first]])


def pieces(engine, complete) -> tuple[list[str], int]:
    """The greedy text pieces of PROMPT and the first i where pieces i and i+1 both carry text."""
    events, _ = complete(engine, PROMPT, num_predict=12)
    texts = [event.text for event in events]
    return texts, next(i for i in range(len(texts) - 1) if texts[i] and texts[i + 1])


def test_a_stop_string_split_across_tokens_ends_the_output_before_it(engine, complete):
    texts, i = pieces(engine, complete)
    full = "".join(texts)
    stop = texts[i][-1] + texts[i + 1][0]
    events, done = complete(engine, PROMPT, num_predict=12, stop=["never there", stop])
    assert done.done_reason == "stop" and done.text == ""
    assert text_of(events, done) == full[: full.index(stop)]
    assert len(events) <= i + 2


def test_text_that_could_begin_a_stop_string_is_held_then_released(engine, complete):
    texts, i = pieces(engine, complete)
    events, done = complete(engine, PROMPT, num_predict=12, stop=[texts[i] + "\x00"])
    assert events[i].text == "" and events[i + 1].text == texts[i] + texts[i + 1]
    assert text_of(events, done) == "".join(texts) and done.done_reason == "length"


def test_logprobs_under_greedy_put_the_chosen_token_on_top(engine, complete, qwen3_model):
    events, _ = complete(engine, PROMPT, num_predict=6, logprobs=True, top_logprobs=4)
    for event in events:
        assert len(event.top_logprobs) == 4
        assert event.top_logprobs[0] == (event.token, event.logprob)
        values = [logprob for _, logprob in event.top_logprobs]
        assert values == sorted(values, reverse=True) and values[0] <= 0
    logits = qwen3_model(mx.array(PROMPT, mx.int32)[None])[0, -1]
    expected = logits - mx.logsumexp(logits)
    assert abs(events[0].logprob - expected[events[0].token].item()) < 1e-4
    assert [token for token, _ in events[0].top_logprobs] == mx.argsort(-expected)[:4].tolist()


def test_logprobs_are_absent_unless_asked(engine, complete):
    events, _ = complete(engine, PROMPT, num_predict=3, top_logprobs=4)
    assert all(event.logprob is None and event.top_logprobs == [] for event in events)


def test_the_buffer_pool_is_released_each_time_generation_crosses_256_tokens(engine, complete, monkeypatch):
    releases = []
    monkeypatch.setattr(mx, "clear_cache", lambda: releases.append(True))
    events, done = complete(engine, PROMPT[:4], num_predict=520, num_ctx=1024)
    assert done.done_reason == "length" and len(events) == 520
    assert len(releases) == 2
