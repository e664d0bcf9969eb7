"""Penalties, filters and seeded draws of the sampler, on hand-made logits."""

from __future__ import annotations

import math

import attrs
import mlx.core as mx
import pytest

from plugd.protocol import SamplingParams
from plugd.runner.sampling import Sampler, apply_penalties, filter_logits

NEUTRAL = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)


def kept(logits: mx.array) -> set[int]:
    return {i for i, value in enumerate(logits.tolist()) if value != -math.inf}


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = mx.array([2.0, -2.0, 1.0, 0.5])
    params = SamplingParams(repeat_penalty=2.0)
    assert apply_penalties(logits, mx.array([0, 1, 1], mx.int32), params).tolist() == [1.0, -4.0, 1.0, 0.5]


def test_presence_penalty_counts_once_and_frequency_penalty_per_occurrence():
    logits = mx.array([2.0, -2.0, 1.0, 0.5])
    params = SamplingParams(repeat_penalty=1.0, presence_penalty=0.5, frequency_penalty=0.25)
    assert apply_penalties(logits, mx.array([0, 1, 1], mx.int32), params).tolist() == [1.25, -3.0, 1.0, 0.5]


def test_penalties_look_only_at_the_last_repeat_last_n_tokens():
    logits = mx.array([3.0, 2.9, 0.0, 0.0])
    params = SamplingParams(temperature=0.0, repeat_penalty=2.0, repeat_last_n=2)
    assert Sampler(params, [0], num_ctx=64)(logits)[0].item() == 1  # token 0 was just seen: 3.0 / 2 < 2.9
    assert Sampler(params, [0, 2, 3], num_ctx=64)(logits)[0].item() == 0  # token 0 is outside the window
    whole_context = SamplingParams(temperature=0.0, repeat_penalty=2.0, repeat_last_n=-1)
    assert Sampler(whole_context, [0, *[2] * 100], num_ctx=128)(logits)[0].item() == 1


def test_the_sampler_penalises_the_tokens_it_has_drawn_itself():
    logits = mx.array([3.0, 2.9, 0.0, 0.0])
    sampler = Sampler(SamplingParams(temperature=0.0, repeat_penalty=2.0), [], num_ctx=64)
    assert [sampler(logits)[0].item() for _ in range(2)] == [0, 1]


def test_no_penalty_leaves_greedy_at_the_argmax():
    logits = mx.array([0.1, 0.7, 0.3])
    token, logprobs = Sampler(SamplingParams(temperature=0.0, repeat_penalty=1.0), [1, 1], num_ctx=8)(logits)
    assert token.dtype == mx.int32 and token.item() == 1
    assert mx.allclose(logprobs, logits - mx.logsumexp(logits)).item()


def test_top_k_keeps_the_k_likeliest_tokens():
    logits = mx.array([1.0, 4.0, 3.0, 2.0])
    assert kept(filter_logits(logits, SamplingParams(top_k=2, top_p=1.0, min_p=0.0))) == {1, 2}


@pytest.mark.parametrize(("top_p", "expected"), [(0.7, {0, 1}), (0.45, {0}), (0.9, {0, 1, 2}), (1.0, {0, 1, 2, 3})])
def test_top_p_keeps_the_smallest_set_reaching_the_mass(top_p, expected):
    logits = mx.log(mx.array([0.5, 0.3, 0.15, 0.05]))
    assert kept(filter_logits(logits, SamplingParams(top_k=0, top_p=top_p, min_p=0.0))) == expected


def test_min_p_drops_tokens_far_less_likely_than_the_best():
    logits = mx.log(mx.array([0.5, 0.3, 0.15, 0.05]))
    assert kept(filter_logits(logits, SamplingParams(top_k=0, top_p=1.0, min_p=0.25))) == {0, 1, 2}


def draws(params: SamplingParams, count: int = 40) -> list[int]:
    sampler = Sampler(params, [], num_ctx=64)
    logits = mx.array([1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, -3.0])
    return [sampler(logits)[0].item() for _ in range(count)]


def test_seeded_draws_repeat_and_differ_between_seeds():
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=3)
    first = draws(params)
    assert draws(params) == first
    assert draws(attrs.evolve(params, seed=4)) != first
    assert len(set(first)) > 3  # a real draw, not the argmax over and over


def test_unseeded_draws_differ():
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
    assert draws(params) != draws(params)
    assert draws(attrs.evolve(params, seed=-1)) != draws(params)


def test_draws_come_only_from_the_filtered_tokens():
    assert set(draws(SamplingParams(temperature=2.0, top_k=3, top_p=1.0, repeat_penalty=1.0, seed=0), 60)) == {0, 1, 2}


def test_log_probabilities_are_those_before_filters_and_temperature():
    logits = mx.array([1.0, 0.5, -1.0])
    _, logprobs = Sampler(SamplingParams(temperature=3.0, top_k=1, repeat_penalty=1.0, seed=1), [], 8)(logits)
    assert mx.allclose(logprobs, logits - mx.logsumexp(logits)).item()



@pytest.mark.parametrize("params", [SamplingParams(top_k=3, top_p=1.0), SamplingParams(top_k=0, top_p=0.5),
                                    SamplingParams(top_k=0, top_p=1.0, min_p=0.2),
                                    SamplingParams(top_k=4, top_p=0.8, min_p=0.05)])
def test_filters_over_a_row_of_positions_are_each_positions_own(params):
    """What verifying drafted tokens filters at once, several positions' logits, equals filtering each alone."""
    rows = mx.random.normal((5, 32), key=mx.random.key(3))
    assert mx.array_equal(filter_logits(rows, params), mx.stack([filter_logits(row, params) for row in rows]))


def test_a_row_of_positions_scores_as_each_position_alone():
    """Sampler.positions (drafted tokens being verified) gives each position what `scored` gives it alone, with
    penalties over the tokens before it and without."""
    logits = mx.random.normal((4, 32), key=mx.random.key(5))
    following = mx.array([3, 7, 3], mx.int32)
    for params in (SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=0.7, repeat_penalty=1.3)):
        sampler = Sampler(params, [1, 3, 9], num_ctx=64)
        logprobs, scores = sampler.positions(logits, following)
        for i in range(4):
            alone = sampler.scored(logits[i], following[:i])
            assert mx.allclose(logprobs[i], alone[0]) and mx.array_equal(scores[i], alone[1])
