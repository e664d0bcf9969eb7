"""Attention on the CPU through numpy equals MLX's kernel to float32 rounding, for every mask the models pass; a
vision tower's attention over every patch, taken a block of queries at a time, equals one pass."""

from __future__ import annotations

import mlx.core as mx
import pytest

from plugd.nn.attention import HOST_DECODE_MIN_KEYS, attend_all, scaled_dot_product_attention, traceable
from plugd.nn.host_attention import host_attention
from plugd.nn.rotating import window_mask

SCALE = 0.125


def _tensors(heads: int, kv_heads: int, length: int, keys: int, dtype=mx.float32, batch: int = 1):
    mx.random.seed(heads * 1000 + length * 10 + keys)
    q = mx.random.normal((batch, heads, length, 64)).astype(dtype)
    k = mx.random.normal((batch, kv_heads, keys, 64)).astype(dtype)
    v = mx.random.normal((batch, kv_heads, keys, 64)).astype(dtype)
    return q, k, v


def _difference(q, k, v, mask) -> float:
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE, mask=mask)
    got = host_attention(q, k, v, SCALE, mask)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    return mx.abs(got.astype(mx.float32) - expected.astype(mx.float32)).max().item()


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (12, 4), (8, 1)])
@pytest.mark.parametrize(("length", "keys"), [(7, 7), (16, 300), (300, 300), (1, 1), (1, 3000)])
def test_causal_over_a_cache_matches_mlx(heads, kv_heads, length, keys):
    assert _difference(*_tensors(heads, kv_heads, length, keys), "causal") < 1e-5


def test_no_mask_batched_matches_mlx():
    assert _difference(*_tensors(6, 2, 33, 90, batch=2), None) < 1e-5


def test_sliding_window_mask_matches_mlx():
    mask = window_mask(200, 40, 100, 140, 64)
    assert isinstance(mask, mx.array) and not mask.all().item()
    assert _difference(*_tensors(8, 2, 40, 140), mask) < 1e-5


def test_per_head_additive_mask_matches_mlx():
    q, k, v = _tensors(4, 2, 20, 50, batch=2)
    mask = mx.random.normal((2, 4, 20, 50))
    assert _difference(q, k, v, mask) < 1e-5


def test_bidirectional_block_in_a_causal_mask_matches_mlx():
    """As Gemma 3 attends within an image: a causal mask with one block opened both ways."""
    positions = mx.arange(60)
    causal = positions[None] <= positions[:, None]
    image = (positions >= 20) & (positions < 36)
    mask = causal | (image[None] & image[:, None])
    assert _difference(*_tensors(4, 4, 60, 60), mask) < 1e-5


def test_half_precision_inputs_come_back_in_their_dtype():
    assert _difference(*_tensors(4, 2, 30, 80, dtype=mx.bfloat16), "causal") < 2e-2


def test_a_multi_token_query_on_the_cpu_goes_through_numpy_and_traceable_keeps_it_in_mlx():
    q, k, v = _tensors(12, 4, 64, 1000)
    assert mx.default_device().type == mx.DeviceType.cpu
    host = host_attention(q, k, v, SCALE, "causal")
    kernel = mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE, mask="causal")
    assert not mx.array_equal(host, kernel).item()  # the two paths can be told apart
    assert mx.array_equal(scaled_dot_product_attention(q, k, v, SCALE, "causal"), host).item()
    with traceable():
        assert mx.array_equal(scaled_dot_product_attention(q, k, v, SCALE, "causal"), kernel).item()
    one = q[:, :, -1:]
    assert mx.array_equal(
        scaled_dot_product_attention(one, k, v, SCALE), mx.fast.scaled_dot_product_attention(one, k, v, scale=SCALE)
    ).item()


def test_one_token_over_a_long_cache_goes_through_numpy():
    q, k, v = _tensors(12, 4, 1, HOST_DECODE_MIN_KEYS)
    host = host_attention(q, k, v, SCALE, None)
    assert not mx.array_equal(host, mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE)).item()
    assert mx.array_equal(scaled_dot_product_attention(q, k, v, SCALE), host).item()


def test_gradients_flow_through_attention_inside_traceable():
    q, k, v = _tensors(4, 2, 16, 16)

    def loss(q):
        with traceable():
            return scaled_dot_product_attention(q, k, v, SCALE, "causal").sum()

    grad = mx.grad(loss)(q)
    expected = mx.grad(lambda q: mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE, mask="causal").sum())(q)
    assert mx.abs(grad).max().item() > 0
    assert mx.allclose(grad, expected).item()


@pytest.mark.parametrize("max_scores", [1, 4 * 90 * 7, 4 * 90 * 100, 1 << 26])  # one query a block ... one pass
def test_attention_to_every_key_in_blocks_of_queries_equals_one_pass(max_scores):
    q, k, v = _tensors(4, 4, 33, 90, batch=2)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE)
    assert mx.abs(attend_all(q, k, v, SCALE, max_scores) - expected).max().item() < 1e-5


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (12, 4), (8, 1)])
@pytest.mark.parametrize("mask", ["none", "rows", "heads", "additive", "window"])
def test_a_single_query_per_row_matches_mlx(heads, kv_heads, mask):
    """A decode step's attention (one query per row, fewer keys than go to numpy) on the CPU: each key/value head's
    group of query heads in one product, for each mask a batch or a sliding window gives a single query."""
    q, k, v = _tensors(heads, kv_heads, 1, 300, batch=3)
    pads = mx.arange(300)[None] >= mx.array([0, 40, 7])[:, None]  # each row's padding, as a batch cache hides it
    masks = {"none": None, "rows": pads[:, None, None, :], "heads": mx.broadcast_to(pads[:, None, None, :],
             (3, heads, 1, 300)), "additive": mx.where(pads, 0.0, -1e9)[:, None, None, :],
             "window": window_mask(299, 1, 0, 300, 64)}
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE, mask=masks[mask])
    assert mx.abs(scaled_dot_product_attention(q, k, v, SCALE, masks[mask]) - expected).max().item() < 1e-5
