"""Batch caches (plugd.nn.batch_cache): rows at different offsets decode together, and each row's attention sees
exactly what its own single-sequence cache would show it, whatever joins or leaves the batch."""

import mlx.core as mx
import numpy as np

from plugd.nn.attention import attend
from plugd.nn.cache import KVCache
from plugd.nn.recurrent import RecurrentCache
from plugd.nn.rotating import RotatingKVCache

HEADS, DIMS = 2, 4


def step_inputs(rows: int, seed: int) -> tuple[mx.array, mx.array, mx.array]:
    """Queries, keys and values of one decode step for `rows` rows."""
    q, k, v = mx.random.normal((3, rows, HEADS, 1, DIMS), key=mx.random.key(seed))
    return q, k, v


def filled(cache, length: int, seed: int):
    if length:
        keys, values = mx.random.normal((2, 1, HEADS, length, DIMS), key=mx.random.key(seed))
        cache.update_and_fetch(keys, values)
    return cache


def alone(cache, q, k, v) -> mx.array:
    keys, values = cache.update_and_fetch(k, v)
    return attend(q, keys, values, 1.0, cache)


def together(batch, q, k, v) -> mx.array:
    keys, values = batch.update_and_fetch(k, v)
    return attend(q, keys, values, 1.0, batch)


def check_steps(singles: list, batch, steps: int, seed: int) -> None:
    """Decode `steps` steps on each single cache and on the batch of their rows; outputs agree row by row."""
    for step in range(steps):
        q, k, v = step_inputs(len(singles), seed + step)
        expected = mx.concatenate([alone(c, q[i : i + 1], k[i : i + 1], v[i : i + 1]) for i, c in enumerate(singles)])
        assert np.allclose(np.array(together(batch, q, k, v)), np.array(expected), atol=1e-5)


def test_kv_rows_at_different_offsets_attend_as_they_would_alone():
    singles = [filled(KVCache(step=4), n, seed) for seed, n in enumerate((5, 2, 0))]
    batch = singles[0].batch()
    batch.extend([filled(KVCache(step=4), n, seed) for seed, n in enumerate((5, 2, 0))], [64] * 3)
    assert batch.offsets == [5, 2, 0] and batch.pads == [0, 3, 5]
    assert batch.offset.tolist() == [5, 2, 0]
    check_steps(singles, batch, 6, seed=10)
    late = filled(KVCache(step=4), 20, seed=7)  # longer than every row: the others move right
    batch.extend([filled(KVCache(step=4), 20, seed=7)], [64])
    singles.append(late)
    check_steps(singles, batch, 3, seed=20)
    batch.keep([3, 1])  # the longest two rows gone: padding no row needs is dropped
    singles = [singles[3], singles[1]]
    assert batch.offsets == [23, 11] and min(batch.pads) == 0
    check_steps(singles, batch, 3, seed=30)


def test_a_row_copies_back_out_as_the_sequence_alone():
    singles = [filled(KVCache(step=4), n, seed) for seed, n in enumerate((3, 6))]
    batch = singles[0].batch()
    batch.extend([filled(KVCache(step=4), n, seed) for seed, n in enumerate((3, 6))], [64, 64])
    check_steps(singles, batch, 4, seed=40)
    out = batch.row(0)
    assert out.offset == singles[0].offset == 7
    assert np.array_equal(np.array(out.state[0]), np.array(singles[0].state[0]))
    batch.update_and_fetch(*step_inputs(2, 50)[1:])  # the copy owns its positions
    assert out.offset == 7 and np.array_equal(np.array(out.state[0]), np.array(singles[0].state[0]))


def test_sliding_window_rows_see_only_their_window():
    def rotating():
        return RotatingKVCache(window=4, slack=2, step=2)

    lengths = (9, 1, 3)
    singles = [filled(rotating(), n, seed) for seed, n in enumerate(lengths)]
    batch = rotating().batch()
    batch.extend([filled(rotating(), n, seed) for seed, n in enumerate(lengths)], [64] * 3)
    check_steps(singles, batch, 12, seed=60)  # past several compactions of the batch buffer
    assert batch.keys.shape[2] <= 4 - 1 + 2 + 2 + 1
    back = batch.row(1)
    assert (back.offset, back.window) == (13, 4)
    again = back.batch()
    again.extend([back], [64])  # copies the row's positions: `back` and `again` go on separately
    check_steps([back], again, 2, seed=80)


def test_recurrent_rows_keep_their_own_states():
    seen = RecurrentCache()
    seen.advance(mx.full((1, 3, 8), 2.0), mx.full((1, 2, 4, 4), 3.0), 7)
    batch = seen.batch()
    batch.extend([RecurrentCache(), seen], [64, 64])  # a row that has seen nothing starts from zeros
    assert batch.offsets == [0, 7] and batch.conv.shape == (2, 3, 8)
    assert batch.conv[0].max().item() == 0.0 and batch.recurrent[1].min().item() == 3.0
    batch.advance(batch.conv + 1, batch.recurrent + 1, 1)
    batch.keep([1])
    row = batch.row(0)
    assert row.offset == 8 and row.recurrent.shape == (1, 2, 4, 4) and row.recurrent.min().item() == 4.0
    assert batch.nbytes == (3 * 8 + 2 * 4 * 4) * 4
