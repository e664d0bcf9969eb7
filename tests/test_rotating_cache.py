"""The sliding-window cache on its own: what it keeps, what it can forget, its masks and snapshots, and attention
through it against attention over the whole sequence with an explicit window mask."""

import mlx.core as mx
import numpy as np
import pytest

from plugd.nn.rotating import RotatingKVCache, window_mask

WINDOW = 8


def positions(length: int, start: int = 0) -> mx.array:
    """Keys whose every feature is their position, so what a cache returns says which positions it holds."""
    return mx.broadcast_to(mx.arange(start, start + length, dtype=mx.float32)[None, None, :, None], (1, 2, length, 4))


def held(keys: mx.array) -> list[int]:
    return [int(p) for p in keys[0, 0, :, 0].tolist()]


def test_keeps_the_window_and_slack_and_drops_the_rest():
    cache = RotatingKVCache(WINDOW, slack=3, step=2)
    for start, length in ((0, 5), (5, 9), (14, 1), (15, 1), (16, 6)):
        keys, _ = cache.update_and_fetch(positions(length, start), positions(length, start))
        # Whatever was dropped, the returned keys are consecutive up to the newest position.
        assert held(keys) == list(range(cache.start, start + length))
        # The earliest new query still sees its whole window.
        assert cache.start <= max(0, start - (WINDOW - 1))
    assert cache.offset == 22 and cache.start > 0
    assert cache.stored <= (WINDOW - 1 + 3) + 6


def test_trim_stops_where_the_next_window_would_reach_dropped_positions():
    cache = RotatingKVCache(WINDOW, slack=3, step=1)
    cache.update_and_fetch(positions(30), positions(30))
    cache.update_and_fetch(positions(2, 30), positions(2, 30))  # compacts: keeps 7 + 3 before the new ones
    assert cache.start == 30 - 10
    assert cache.trim(10) == 5  # down to offset 27: positions 20..26 are the next query's window
    assert cache.offset == 27
    assert cache.trim(1) == 0
    keys, _ = cache.update_and_fetch(positions(1, 27), positions(1, 27))
    assert held(keys)[-WINDOW:] == list(range(20, 28))


def test_before_anything_is_dropped_everything_can_be_forgotten():
    cache = RotatingKVCache(WINDOW)
    cache.update_and_fetch(positions(20), positions(20))
    assert cache.trim(50) == 20 and cache.offset == 0


def test_a_snapshot_is_unchanged_by_later_updates_and_restores_exactly():
    cache = RotatingKVCache(WINDOW, slack=0, step=1)
    assert cache.state is None
    cache.update_and_fetch(positions(12), positions(12))
    snapshot = cache.state
    cache.update_and_fetch(positions(5, 12), positions(5, 12))
    assert held(snapshot.keys) == list(range(snapshot.start, 12)) and snapshot.offset == 12
    cache.state = snapshot
    keys, _ = cache.update_and_fetch(positions(1, 12), positions(1, 12))
    assert held(keys)[-WINDOW:] == list(range(5, 13))
    cache.state = None
    assert cache.offset == 0 and cache.keys is None


def test_a_snapshot_survives_writes_over_positions_it_covers():
    cache = RotatingKVCache(WINDOW, slack=4, step=8)
    cache.update_and_fetch(positions(12), positions(12))
    snapshot = cache.state
    mx.eval(snapshot)
    assert cache.trim(2) == 2
    cache.update_and_fetch(positions(2, 100), positions(2, 100))  # in place, over positions 10 and 11
    assert held(snapshot.keys) == list(range(12))
    assert held(cache.state.keys)[-3:] == [9, 100, 101]


def test_window_mask():
    assert window_mask(0, 1, 0, 1, WINDOW) is None
    assert window_mask(0, 8, 0, 8, WINDOW) == "causal"
    mask = np.array(window_mask(10, 3, 2, 11, WINDOW))
    # Query 10 sees 3..10, query 12 sees 5..12 (key column j is position 2 + j).
    assert mask[0].nonzero()[0].tolist() == list(range(1, 9))
    assert mask[2].nonzero()[0].tolist() == list(range(3, 11))


@pytest.mark.parametrize("slack, step", [(0, 1), (5, 3), (256, 256)])
def test_attention_through_the_cache_equals_windowed_attention_over_everything(slack, step):
    rng = np.random.default_rng(0)
    length = 40
    q, k, v = (mx.array(rng.standard_normal((1, 2, length, 4)), mx.float32) for _ in range(3))
    allowed = window_mask(0, length, 0, length, WINDOW)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.5, mask=allowed)
    cache = RotatingKVCache(WINDOW, slack=slack, step=step)
    outputs = []
    for start, end in ((0, 3), (3, 17), (17, 18), (18, 19), (19, 33), (33, 40)):
        keys, values = cache.update_and_fetch(k[:, :, start:end], v[:, :, start:end])
        mask = cache.mask(end - start)
        outputs.append(mx.fast.scaled_dot_product_attention(q[:, :, start:end], keys, values, scale=0.5, mask=mask))
    assert mx.allclose(mx.concatenate(outputs, axis=2), expected, atol=1e-6)
