"""The KV cache: growth, trimming and snapshots, alone and inside a model's decode."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from plugd.nn.cache import KVCache
from plugd.runner.loading import load_model
from plugd.testing.checkpoints import write_checkpoint
from plugd_qwen import qwen3

PROMPT = mx.array(np.random.default_rng(11).integers(0, 512, 64), mx.int32)


def positions(start: int, end: int) -> mx.array:
    """Keys whose every entry is their position, (1, 2, end - start, 4)."""
    return mx.broadcast_to(mx.arange(start, end, dtype=mx.float32)[None, None, :, None], (1, 2, end - start, 4))


def test_grows_in_steps_and_returns_exactly_the_cached_positions():
    cache = KVCache(step=8)
    cache.update_and_fetch(positions(0, 5), positions(0, 5))
    keys, values = cache.update_and_fetch(positions(5, 11), positions(5, 11))
    assert cache.offset == 11 and cache.keys.shape[2] == 16
    assert mx.array_equal(keys, positions(0, 11)) and mx.array_equal(values, positions(0, 11))


def test_trim_forgets_the_last_positions_and_later_writes_replace_them():
    cache = KVCache(step=8)
    cache.update_and_fetch(positions(0, 10), positions(0, 10))
    assert cache.trim(4) == 4 and cache.offset == 6
    keys, _ = cache.update_and_fetch(positions(100, 102), positions(100, 102))
    assert mx.array_equal(keys, mx.concatenate([positions(0, 6), positions(100, 102)], axis=2))
    assert cache.trim(50) == 8 and cache.offset == 0


def test_snapshot_is_unchanged_by_later_writes_and_restores():
    cache = KVCache(step=8)
    cache.update_and_fetch(positions(0, 6), positions(0, 6))
    snapshot = cache.state
    mx.eval(snapshot)
    cache.trim(3)
    cache.update_and_fetch(positions(50, 55), positions(50, 55))
    assert mx.array_equal(snapshot[0], positions(0, 6))
    restored = KVCache(step=8)
    restored.state = snapshot
    keys, _ = restored.update_and_fetch(positions(6, 7), positions(6, 7))
    assert restored.offset == 7 and mx.array_equal(keys, positions(0, 7))
    assert KVCache().state is None


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(write_checkpoint(tmp_path_factory.mktemp("qwen3"), "qwen3", seed=5), qwen3)


def test_trimmed_model_cache_recomputes_the_same_logits(model):
    cache = model.make_cache()
    model(PROMPT[None, :48], cache)
    first = model(PROMPT[None, 48:], cache)
    mx.eval(first)
    assert [layer.trim(16) for layer in cache] == [16] * len(cache)
    again = model(PROMPT[None, 48:], cache)
    assert mx.allclose(first, again, atol=1e-5)


def test_model_cache_snapshot_restores_into_fresh_caches(model):
    cache = model.make_cache()
    model(PROMPT[None, :48], cache)
    snapshot = [layer.state for layer in cache]
    mx.eval(snapshot)
    first = model(PROMPT[None, 48:], cache)
    mx.eval(first)
    restored = model.make_cache()
    for layer, state in zip(restored, snapshot):
        layer.state = state
    again = model(PROMPT[None, 48:], restored)
    assert mx.allclose(first, again, atol=1e-5)
