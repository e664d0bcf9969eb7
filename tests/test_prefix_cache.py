"""Prompt caching scenarios on the runner's engine and a tiny qwen3: every cached completion's next-token
distribution matches an uncached run's (float32, 1e-5), and only the tokens past the restore point are evaluated."""

from __future__ import annotations

import importlib
import zlib

import numpy as np
import pytest

from plugd import plugins
from plugd.runner.cache_policy import SingleSlotPolicy, chosen_factory, make_policy
from plugd.runner.generate import CompletionRequest, Engine
from plugd.runner.loading import load_model
from plugd.runner.sampling import SamplingParams
from plugd.runner.tokenizer import Tokenizer
from plugd.testing.checkpoints import write_checkpoint
from plugd_prefix_cache.policy import PrefixCachePolicy

GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)
CHUNK = 16
NUM_PREDICT = 4  # the first three generated tokens enter the cache, the last is never fed back


@pytest.fixture
def tokens(request):
    """Random prompt tokens, seeded by the test's name so each test is deterministic on its own."""
    rng = np.random.default_rng(zlib.crc32(request.node.name.encode()))
    return lambda n: rng.integers(0, 480, n).tolist()


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    path = write_checkpoint(tmp_path_factory.mktemp("prefix") / "qwen3", "qwen3", seed=2)
    module = importlib.import_module(plugins.load().architectures()["qwen3"].module)
    return load_model(path, module), Tokenizer.from_dir(path)


def engine(loaded, **policy_options) -> Engine:
    model, tokenizer = loaded
    return Engine(model, tokenizer, prefill_chunk=CHUNK,
                  cache_policy=lambda m: PrefixCachePolicy(m, **({"budget": 1 << 30} | policy_options)))


def complete(engine: Engine, prompt: list[int], cancelled=lambda: False):
    """The generated tokens, the first step's full log-distribution and the done event."""
    request = CompletionRequest(tokens=prompt, sampling=GREEDY, num_predict=NUM_PREDICT, num_ctx=1024, num_keep=0,
                                stop=[], logprobs=True, top_logprobs=engine.logits_width)
    *events, done = engine.complete(request, cancelled)
    distribution = dict(events[0].top_logprobs) if events else {}
    return [event.token for event in events], distribution, done


@pytest.fixture(scope="module")
def cold(loaded):
    """Uncached results, by prompt."""
    model, tokenizer = loaded
    results: dict[tuple[int, ...], tuple] = {}

    def run(prompt: list[int]):
        if tuple(prompt) not in results:
            results[tuple(prompt)] = complete(Engine(model, tokenizer, prefill_chunk=CHUNK), prompt)
        return results[tuple(prompt)]

    return run


def assert_matches_cold(result, cold_result):
    generated, distribution, _ = result
    cold_generated, cold_distribution, cold_done = cold_result
    assert cold_done.prompt_eval_count == cold_done.prompt_tokens
    assert generated == cold_generated
    assert distribution, "the first generated token ended the completion: no distribution to compare"
    assert distribution.keys() == cold_distribution.keys()
    difference = max(abs(distribution[t] - cold_distribution[t]) for t in distribution)
    assert difference <= 1e-5


def test_multi_turn_growth_evaluates_only_new_tokens(loaded, cold, tokens):
    cached, conversation = engine(loaded), tokens(40)
    for turn in range(4):
        result = complete(cached, conversation)
        assert_matches_cold(result, cold(conversation))
        new = len(conversation) if turn == 0 else 1 + 20  # the last generated token was never fed back
        assert result[2].prompt_eval_count == new
        conversation = conversation + result[0] + tokens(20)


def test_divergent_variants_each_resume_from_the_trie(loaded, cold, tokens):
    cached, base = engine(loaded), tokens(48)
    variants = [base + tokens(12) for _ in range(3)]
    for variant in variants:
        assert_matches_cold(complete(cached, variant), cold(variant))
    for variant in variants:  # each is back where it was: only its last prompt token is evaluated
        result = complete(cached, variant)
        assert_matches_cold(result, cold(variant))
        assert result[2].prompt_eval_count == 1


def test_single_slot_forgets_the_variants(loaded, cold, tokens):
    model, tokenizer = loaded
    single, base = Engine(model, tokenizer, prefill_chunk=CHUNK), tokens(48)
    first, second = base + tokens(12), base + tokens(12)
    complete(single, first)
    complete(single, second)
    result = complete(single, first)
    assert_matches_cold(result, cold(first))
    assert result[2].prompt_eval_count == 12


def cancel_after(chunks: int):
    """A `cancelled` poll that lets `chunks` prefill chunks run."""
    polls = iter(range(chunks + 1))
    return lambda: next(polls, chunks) == chunks


def test_a_cancelled_prefill_is_resumed_from_its_last_restore_point(loaded, cold, tokens):
    cached, prompt = engine(loaded), tokens(150)
    done_so_far = 0
    for chunks in (2, 1, 3):
        _, _, done = complete(cached, prompt, cancel_after(chunks))
        assert done.done_reason == "cancel"
        assert done.prompt_eval_count == chunks * CHUNK
        done_so_far += chunks * CHUNK
        cached.cache.reset()  # even without the live caches, the trie holds every finished chunk
    result = complete(cached, prompt)
    assert result[2].prompt_eval_count == len(prompt) - done_so_far
    assert_matches_cold(result, cold(prompt))


def test_resume_partway_into_an_edge_splits_the_node(loaded, cold, tokens):
    cached, stored = engine(loaded, interval=1024), tokens(40)
    cached.prefill_chunk = 512  # one chunk: the stored prompt is one edge
    complete(cached, stored)
    complete(cached, tokens(30))  # the live caches move to another branch
    nodes = cached.cache.stats()["nodes"]
    partway = stored[:25] + tokens(10)
    result = complete(cached, partway)
    assert result[2].prompt_eval_count == 10
    assert_matches_cold(result, cold(partway))
    assert cached.cache.stats()["nodes"] == nodes + 3  # the split's tail, the new branch, its decoded tokens
    result = complete(cached, stored)
    assert result[2].prompt_eval_count == 1
    assert_matches_cold(result, cold(stored))


def test_eviction_keeps_the_trie_within_budget_and_results_exact(loaded, cold, tokens):
    probe = engine(loaded)
    complete(probe, tokens(20))
    bytes_per_token = probe.cache.stats()["bytes"] / len(probe.cache.tokens)
    budget = int(bytes_per_token * 90)
    cached, base = engine(loaded, budget=budget), tokens(32)
    variants = [base + tokens(17) for _ in range(4)]
    for variant in variants:
        assert_matches_cold(complete(cached, variant), cold(variant))
        assert 0 < cached.cache.stats()["bytes"] <= budget
    result = complete(cached, variants[0])  # the least recently used branch is gone, the shared base is not
    assert 1 < result[2].prompt_eval_count < len(variants[0]) - len(base) + 1
    assert_matches_cold(result, cold(variants[0]))


def test_a_budget_smaller_than_the_live_path_still_resumes_the_live_caches(loaded, cold, tokens):
    cached, conversation = engine(loaded, budget=1), tokens(30)
    generated, _, _ = complete(cached, conversation)
    assert cached.cache.stats() == {"bytes": 0, "nodes": 0}
    follow_up = conversation + generated + tokens(10)
    result = complete(cached, follow_up)
    assert result[2].prompt_eval_count == 1 + 10
    assert_matches_cold(result, cold(follow_up))


def test_policy_choice_prefers_the_plugin_and_honours_the_environment(loaded, monkeypatch):
    policies = plugins.load().named("plugd_cache_policies")
    assert chosen_factory(policies) == "plugd_prefix_cache.policy:prefix_cache"
    monkeypatch.setenv("PLUGD_CACHE_POLICY", "single-slot")
    assert isinstance(make_policy(chosen_factory(policies), loaded[0]), SingleSlotPolicy)
    monkeypatch.setenv("PLUGD_CACHE_POLICY", "nonesuch")
    with pytest.raises(ValueError, match="unknown cache policy"):
        chosen_factory(policies)
    monkeypatch.delenv("PLUGD_CACHE_POLICY")
    assert chosen_factory({k: v for k, v in policies.items() if k != "prefix-cache"}) == (
        "plugd.runner.cache_policy:single_slot")
