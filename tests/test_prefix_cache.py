"""Prompt caching scenarios on the runner's engine and tiny checkpoints of every cache kind: plain KV (qwen3),
Gated DeltaNet + attention (qwen3_5), Mamba2 + attention (nemotron_h) and sliding-window rotating caches
(gemma3_text). Every cached completion's next-token distribution matches an uncached run's (float32, 1e-5), and
exactly the tokens past the restore point are evaluated."""

from __future__ import annotations

import importlib
import zlib

import mlx.core as mx
import numpy as np
import pytest

from plugd import plugins
from plugd.protocol import Completion, SamplingParams
from plugd.runner.generate import Engine
from plugd.runner.loading import load_model
from plugd.runner_api import common_prefix
from plugd.testing.checkpoints import write_checkpoint
from plugd.tokenizer import Tokenizer
from plugd_prefix_cache.policy import PrefixCachePolicy
from plugd_prefix_cache.trie import descendants, walk

GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)
CHUNK = 16
NUM_PREDICT = 4  # the first three generated tokens enter the cache, the last is never fed back
MODEL_TYPES = ["qwen3", "qwen3_5", "nemotron_h", "gemma3_text"]


@pytest.fixture
def tokens(request):
    """Random prompt tokens, seeded by the test's name so each test is deterministic on its own."""
    rng = np.random.default_rng(zlib.crc32(request.node.name.encode()))
    return lambda n: rng.integers(0, 480, n).tolist()


@pytest.fixture(scope="module", params=MODEL_TYPES)
def loaded(request, tmp_path_factory):
    path = write_checkpoint(tmp_path_factory.mktemp("prefix") / request.param, request.param, seed=2)
    module = importlib.import_module(plugins.load().architectures()[request.param].module)
    tokenizer = Tokenizer.from_dir(path)
    tokenizer.eos_ids = frozenset()  # random weights may pick it first: every completion then yields a distribution
    return load_model(path, module), tokenizer


def trimmable(loaded) -> bool:
    """Whether every cache can forget its last positions (recurrent state cannot)."""
    return all(layer.trimmable for layer in loaded[0].make_cache())


def kept_whole(loaded) -> bool:
    """Whether some cache is kept whole at node ends (recurrent state, rotating window)."""
    return any(type(layer).__name__ != "KVCache" for layer in loaded[0].make_cache())


def engine(loaded, **policy_options) -> Engine:
    model, tokenizer = loaded
    return Engine(model, tokenizer, prefill_chunk=CHUNK,
                  cache_policy=lambda m: PrefixCachePolicy(m, **({"budget": 1 << 30} | policy_options)))


def complete(engine: Engine, prompt: list[int], cancelled=lambda: False):
    """The generated tokens, the first step's full log-distribution and the done event."""
    request = Completion(tokens=prompt, sampling=GREEDY, num_predict=NUM_PREDICT, num_ctx=1024, num_keep=0,
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


def evaluated(engine: Engine, cold, prompt: list[int], cancelled=lambda: False) -> int:
    """Complete `prompt`, check it against the uncached run, and return how many prompt tokens it evaluated."""
    result = complete(engine, prompt, cancelled)
    assert_matches_cold(result, cold(prompt))
    return result[2].prompt_eval_count


def test_multi_turn_growth_evaluates_only_new_tokens(loaded, cold, tokens):
    cached, conversation = engine(loaded), tokens(40)
    for turn in range(4):
        result = complete(cached, conversation)
        assert_matches_cold(result, cold(conversation))
        new = len(conversation) if turn == 0 else 1 + 20  # the last generated token was never fed back
        assert result[2].prompt_eval_count == new
        conversation = conversation + result[0] + tokens(20)


def test_divergent_variants_each_resume_from_the_trie(loaded, cold, tokens):
    cached, base = engine(loaded), tokens(40)
    variants = [base + tokens(20) for _ in range(3)]
    new = [len(variant) - max(common_prefix(variant, earlier) for earlier in variants[:i]) for i, variant
           in enumerate(variants) if i]  # past the base, unless random tokens happen to agree
    assert evaluated(cached, cold, variants[0]) == 60
    second = evaluated(cached, cold, variants[1])
    if trimmable(loaded):
        assert second == new[0]
    else:  # a recurrent state resumes only from a restore point before the branch, and captures one at it
        assert new[0] < second < 60
    assert evaluated(cached, cold, variants[2]) == new[1]
    for variant in variants:  # each is back where it was: only its last prompt token is evaluated
        assert evaluated(cached, cold, variant) == 1


def test_single_slot_forgets_the_variants(loaded, cold, tokens):
    model, tokenizer = loaded
    single, base = Engine(model, tokenizer, prefill_chunk=CHUNK), tokens(48)
    first, second = base + tokens(12), base + tokens(12)
    complete(single, first)
    complete(single, second)
    count = evaluated(single, cold, first)
    assert count == 12 if trimmable(loaded) else count > 12  # a recurrent state cannot go back to the branch


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
        assert chunks <= done.prompt_eval_count <= chunks * CHUNK
        done_so_far += done.prompt_eval_count
        cached.cache.reset()  # even without the live caches, the trie holds every finished chunk
    assert evaluated(cached, cold, prompt) == len(prompt) - done_so_far


def test_resume_partway_into_an_edge_splits_the_node(loaded, cold, tokens):
    cached, stored = engine(loaded, interval=1024, tail_margins=()), tokens(40)
    cached.prefill_chunk = 512  # one chunk: the stored prompt is one edge
    complete(cached, stored)
    complete(cached, tokens(30))  # the live caches move to another branch
    nodes = cached.cache.stats()["nodes"]
    partway = stored[:25] + tokens(10)
    # A cache kept whole has a state only at the edge's end: it starts over, and captures a restore point at the split.
    assert evaluated(cached, cold, partway) == (35 if kept_whole(loaded) else 10)
    assert cached.cache.stats()["nodes"] == nodes + 3  # the split's tail, the new branch, its decoded tokens
    assert evaluated(cached, cold, stored) == 1
    assert evaluated(cached, cold, stored[:25] + tokens(10)) == 10


def run_variants(cached: Engine, cold, variants: list[list[int]], budget: int | None = None) -> None:
    for variant in variants:
        evaluated(cached, cold, variant)
        if budget is not None:
            assert cached.cache.stats()["bytes"] <= budget


def test_eviction_keeps_the_trie_within_budget_and_results_exact(loaded, cold, tokens):
    base = tokens(32)
    variants = [base + tokens(17) for _ in range(4)]
    unbounded = engine(loaded)
    run_variants(unbounded, cold, variants)
    budget = unbounded.cache.stats()["bytes"] // 2
    cached = engine(loaded, budget=budget)
    run_variants(cached, cold, variants, budget)
    assert cached.cache.stats()["nodes"] < unbounded.cache.stats()["nodes"]
    # the least recently used branch is gone, the branch point at the shared base is not
    assert 1 < evaluated(cached, cold, variants[0]) < len(variants[0]) - len(base) + 1


def restore_points(cached: Engine, prompt: list[int]) -> list[int]:
    """Node ends along `prompt`'s path in the trie."""
    return [node.end for node in walk(cached.cache.root, prompt).path]


def test_eviction_merges_live_path_nodes_without_losing_the_live_caches(loaded, cold, tokens):
    conversation = tokens(120)
    unbounded = engine(loaded)
    complete(unbounded, conversation)
    held, nodes = unbounded.cache.stats()["bytes"], unbounded.cache.stats()["nodes"]
    budget = held * 3 // nodes
    cached = engine(loaded, budget=budget)
    generated = complete(cached, conversation)[0]
    assert cached.cache.stats()["bytes"] <= budget
    if not kept_whole(loaded):  # lazy views of the live buffer: the live path costs nothing, nothing to evict
        assert held == 0 and cached.cache.stats()["nodes"] == nodes
    else:
        assert cached.cache.stats()["nodes"] < nodes
    branch = 100
    points = [end for end in restore_points(cached, conversation) if end <= branch]
    assert evaluated(cached, cold, conversation + generated + tokens(10)) == 1 + 10
    variant = conversation[:branch] + tokens(10)
    expected = 10 if trimmable(loaded) else len(variant) - max(points, default=0)
    assert evaluated(cached, cold, variant) == expected


def test_a_budget_smaller_than_the_live_path_still_resumes_the_live_caches(loaded, cold, tokens):
    cached, conversation = engine(loaded, budget=1), tokens(30)
    generated, _, _ = complete(cached, conversation)
    if kept_whole(loaded):  # every restore point but the live frontier was merged away
        assert cached.cache.stats()["nodes"] == 1
    else:
        assert cached.cache.stats()["bytes"] == 0
    assert evaluated(cached, cold, conversation + generated + tokens(10)) == 1 + 10


def test_paged_out_bytes_are_counted_and_lazy_ones_are_not(loaded, cold, tokens):
    cached, first = engine(loaded), tokens(40)
    complete(cached, first)
    live_bytes = cached.cache.stats()["bytes"]
    complete(cached, tokens(40))  # the first prompt's path is paged out: its keys and values are copied now
    kv_layers = [layer for layer in cached.cache.layers if type(layer).__name__ == "KVCache"]
    per_position = sum(2 * layer.keys[..., :1, :].nbytes for layer in kv_layers)
    paged_out = per_position * (len(first) + NUM_PREDICT - 1)
    if kept_whole(loaded):  # plus the end states of the nodes along it
        assert cached.cache.stats()["bytes"] > live_bytes + paged_out
    else:
        assert (live_bytes, cached.cache.stats()["bytes"]) == (0, paged_out)
    assert all(node.lazy for node in walk(cached.cache.root, cached.cache.tokens).path)
    assert not any(node.lazy for node in walk(cached.cache.root, first).path)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = write_checkpoint(tmp_path_factory.mktemp("media") / "qwen3", "qwen3", seed=2)
    return load_model(path, importlib.import_module(plugins.load().architectures()["qwen3"].module))


def prefill_keys(policy: PrefixCachePolicy, model, keys: list[int]) -> None:
    """Run `keys` into the live caches (a media item's keys as some token) and store them, as the engine does."""
    ids = [key if key >= 0 else 7 for key in keys]
    model(mx.array(ids, mx.int32)[None], cache=policy.layers)
    mx.eval([layer.state for layer in policy.layers])
    policy.tokens += keys
    policy.finished()


def test_no_capture_or_resume_lands_inside_a_media_item(qwen3):
    image = [-9] * 4
    keys = [5, 6, 7, *image, 8, 10, 11]  # the image takes positions 3 .. 6
    policy = PrefixCachePolicy(qwen3, budget=1 << 30, interval=2, tail_margins=(3,))
    assert policy.resume(keys) == 0
    assert list(policy.capture_points(0, len(keys) - 1)) == [2, 8]  # not 4, 6 (the interval) nor 6 (the tail)
    prefill_keys(policy, qwen3, keys[:-1])
    cut_inside = keys[:6]  # a prompt whose end cuts the image: the restore point is the image's start
    assert policy.resume(cut_inside) == 3
    policy.reset()
    assert policy.resume(cut_inside) == 3
    assert all(node.end not in (4, 5, 6) for node in descendants(policy.root))


def test_a_window_that_dropped_positions_resumes_from_a_restore_point(loaded, cold, tokens):
    cached, long = engine(loaded), tokens(600)
    cached.prefill_chunk = 32
    generated = complete(cached, long)[0]
    windows = [layer for layer in cached.cache.layers if type(layer).__name__ == "RotatingKVCache"]
    # positions left the window: it cannot trim back to where the next prompt branches off
    branch = min([window.start + window.window - 1 for window in windows], default=300) - 20
    assert branch > 2 * cached.prefill_chunk
    points = [end for end in restore_points(cached, long) if end <= branch]
    variant = long[:branch] + tokens(10)
    assert evaluated(cached, cold, variant) == (len(variant) - max(points) if kept_whole(loaded) else 10)
    # back on the first branch: the end of its completion is a restore point
    assert evaluated(cached, cold, long + generated + tokens(5)) == 1 + 5
