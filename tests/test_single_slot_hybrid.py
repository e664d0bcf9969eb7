"""The built-in single-slot cache policy on models whose caches cannot all trim back (recurrent Nemotron-H and
Qwen3.5 layers, Gemma's sliding windows): a prompt that extends the live one resumes all of it, one that departs
from it resumes from the nearest snapshot at or before the departure, and every result equals an uncached run's
(greedy tokens, and the first step's log-distribution within 1e-5 in float32)."""

from __future__ import annotations

import importlib
import zlib

import numpy as np
import pytest

from plugd import plugins
from plugd.nn.cache import KVCache
from plugd.nn.rotating import RotatingKVCache
from plugd.protocol import Completion, SamplingParams
from plugd.runner.cache_policy import SNAPSHOTS_BEFORE_END, SingleSlotPolicy
from plugd.runner.generate import Engine
from plugd.runner.loading import load_model
from plugd.testing.checkpoints import write_checkpoint
from plugd.tokenizer import Tokenizer

MODEL_TYPES = ["nemotron_h", "qwen3_5", "gemma3_text"]
GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)
CHUNK = 16
INTERVAL = 32
NUM_PREDICT = 4  # the first three generated tokens enter the caches, the last is never fed back


class NarrowSlack:
    """A model whose sliding-window caches keep 4 positions of slack instead of 256, so that a prompt of a few
    dozen tokens already drops keys its window no longer sees (and trimming back that far becomes impossible)."""

    def __init__(self, model):
        self.model = model

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def make_cache(self) -> list:
        return [RotatingKVCache(layer.window, slack=4, step=8) if isinstance(layer, RotatingKVCache) else layer
                for layer in self.model.make_cache()]


@pytest.fixture(scope="module", params=MODEL_TYPES)
def loaded(request, tmp_path_factory):
    model_type = request.param
    path = write_checkpoint(tmp_path_factory.mktemp("single-slot") / model_type, model_type, seed=5)
    model = load_model(path, importlib.import_module(plugins.load().architectures()[model_type].module))
    return (NarrowSlack(model) if model_type == "gemma3_text" else model), Tokenizer.from_dir(path)


@pytest.fixture
def tokens(request):
    rng = np.random.default_rng(zlib.crc32(request.node.name.encode()))
    return lambda n: rng.integers(0, 480, n).tolist()


def engine(loaded, **policy_options) -> Engine:
    model, tokenizer = loaded
    return Engine(model, tokenizer, prefill_chunk=CHUNK,
                  cache_policy=lambda m: SingleSlotPolicy(m, **({"interval": INTERVAL} | policy_options)))


def complete(engine: Engine, prompt: list[int]):
    """The generated tokens, the first step's full log-distribution and the done event."""
    request = Completion(tokens=prompt, sampling=GREEDY, num_predict=NUM_PREDICT, num_ctx=1024, num_keep=0,
                                stop=[], logprobs=True, top_logprobs=engine.logits_width)
    *events, done = engine.complete(request, lambda: False)
    return [event.token for event in events], dict(events[0].top_logprobs), done


def assert_matches_cold(loaded, prompt: list[int], result) -> None:
    model, tokenizer = loaded
    cold_generated, cold_distribution, cold_done = complete(Engine(model, tokenizer, prefill_chunk=CHUNK), prompt)
    assert cold_done.prompt_eval_count == len(prompt)
    generated, distribution, _ = result
    assert generated == cold_generated
    assert distribution.keys() == cold_distribution.keys()
    assert max(abs(distribution[t] - cold_distribution[t]) for t in distribution) <= 1e-5


def snapshot_points(start: int, end: int) -> set[int]:
    """Where a prefill over prompt positions (start, end] leaves snapshots, by the policy's rule."""
    every = range((start // INTERVAL + 1) * INTERVAL, end, INTERVAL)
    return {*every, *(end - back for back in SNAPSHOTS_BEFORE_END if end - back > start), end}


def resume_point(cached: Engine, departure: int, snapshots: set[int]) -> int:
    """Where the next prompt, departing from the live one at `departure`, must resume: there if every layer can
    still trim back that far (a sliding window that kept the keys it needs), else at the snapshot before it."""
    if all(layer.trim_floor <= departure for layer in cached.cache.layers):
        return departure
    return max((p for p in snapshots if p <= departure), default=0)


def test_the_caches_cannot_trim_back_far(loaded, tokens):
    """The premise: without snapshots these models could not go back (plain KV layers alone could)."""
    cached = engine(loaded)
    complete(cached, tokens(120))
    layers = cached.cache.layers
    assert any(not isinstance(layer, KVCache) and layer.trim_floor > 60 for layer in layers)


def test_a_prompt_that_extends_the_live_one_resumes_all_of_it(loaded, tokens):
    cached, conversation = engine(loaded), tokens(40)
    for turn in range(3):
        result = complete(cached, conversation)
        assert result[2].prompt_eval_count == (len(conversation) if turn == 0 else 1 + 20)
        assert_matches_cold(loaded, conversation, result)
        conversation = conversation + result[0] + tokens(20)


@pytest.mark.parametrize("departure", [100, 75, 40, 20])
def test_a_departing_prompt_resumes_from_the_nearest_snapshot_before_it(loaded, tokens, departure):
    cached, first = engine(loaded), tokens(120)
    complete(cached, first)
    second = first[:departure] + tokens(30)
    restore = resume_point(cached, departure, snapshot_points(0, len(first) - 1))
    result = complete(cached, second)
    assert result[2].prompt_eval_count == len(second) - restore
    assert_matches_cold(loaded, second, result)


def test_the_same_prompt_again_resumes_at_its_end(loaded, tokens):
    cached, prompt = engine(loaded), tokens(50)
    complete(cached, prompt)
    for _ in range(2):
        result = complete(cached, prompt)
        assert result[2].prompt_eval_count == 1
    assert_matches_cold(loaded, prompt, result)


def test_an_agent_session_resumes_before_each_runtime_message_and_keeps_few_snapshots(loaded, tokens):
    """Each turn keeps the transcript, drops the previous runtime message but its first tokens, and appends a
    reply, a tool result and a new runtime message: each resumes from the snapshot nearest the departure."""
    limit = 5
    cached, transcript, start = engine(loaded, limit=limit), tokens(60), 0
    for turn in range(5):
        prompt = transcript + tokens(10)
        result = complete(cached, prompt)
        if turn:
            assert result[2].prompt_eval_count == len(prompt) - start
        assert 0 < cached.cache.stats()["nodes"] <= limit and cached.cache.stats()["bytes"] > 0
        assert_matches_cold(loaded, prompt, result)
        departure = len(transcript) + 6
        start = resume_point(cached, departure, snapshot_points(start, len(prompt) - 1))
        transcript = prompt[:departure] + result[0] + tokens(14)
