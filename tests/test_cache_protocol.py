"""The cache protocol (plugd.nn.cache.Cache) on each kind of layer cache: what a snapshot holds, that later updates
leave it as it was, and that restoring it brings the cache back. Both cache policies rely on nothing else."""

import mlx.core as mx
import numpy as np

from plugd.nn.cache import KVCache, KVSpan, snapshot_arrays
from plugd.nn.recurrent import RecurrentCache
from plugd.nn.rotating import RotatingKVCache


def positions(start: int, count: int) -> tuple[mx.array, mx.array]:
    """Keys and values of `count` positions, (1, 2 heads, count, 4 dims), each position's entries its index."""
    index = mx.arange(start, start + count, dtype=mx.float32)[None, None, :, None]
    keys = mx.broadcast_to(index, (1, 2, count, 4))
    return keys, keys + 1000


def held(cache: KVCache) -> list[float]:
    return np.array(cache.snapshot().keys[0, 0, :, 0]).tolist()


def test_a_kv_cache_snapshots_any_span_and_restores_by_appending():
    cache = KVCache(step=4)
    cache.update_and_fetch(*positions(0, 6))
    middle = cache.snapshot(2, 5)
    assert isinstance(middle, KVSpan) and middle.length == 3 and np.array(middle.keys[0, 0, :, 0]).tolist() == [2, 3, 4]
    cache.trim(4)
    cache.update_and_fetch(*positions(100, 4))  # writes over positions 2.. of the buffer
    assert np.array(middle.keys[0, 0, :, 0]).tolist() == [2, 3, 4]  # the snapshot is an owned copy
    rebuilt = KVCache(step=4)
    rebuilt.restore(cache.snapshot(0, 2))
    rebuilt.restore(middle)
    assert rebuilt.offset == 5 and held(rebuilt) == [0, 1, 2, 3, 4]
    assert KVCache().snapshot() is None and KVCache.spans


def test_a_rotating_cache_snapshots_its_whole_window_as_a_copy():
    cache = RotatingKVCache(window=4, slack=0, step=2)
    cache.update_and_fetch(*positions(0, 5))
    snapshot = cache.snapshot()
    cache.update_and_fetch(*positions(5, 3))  # compacts and writes in place
    assert snapshot.offset == 5 and np.array(snapshot.keys[0, 0, :, 0]).tolist()[-3:] == [2, 3, 4]
    cache.restore(snapshot)
    assert cache.offset == 5 and cache.start == snapshot.start
    assert not RotatingKVCache.spans and RotatingKVCache(4).snapshot() is None


def test_a_recurrent_cache_snapshots_its_state_without_copying():
    cache = RecurrentCache()
    cache.advance(mx.ones((1, 3, 8)), mx.ones((1, 2, 4, 4)), 10)
    snapshot = cache.snapshot()
    cache.advance(mx.zeros((1, 3, 8)), mx.zeros((1, 2, 4, 4)), 5)
    assert snapshot.offset == 10 and bool(mx.all(snapshot.conv == 1))
    cache.restore(snapshot)
    assert cache.offset == 10 and cache.conv is snapshot.conv
    cache.restore(None)
    assert cache.offset == 0 and not RecurrentCache.spans and not RecurrentCache.trimmable


def test_snapshot_arrays_counts_every_array_a_snapshot_holds():
    kv = KVCache()
    kv.update_and_fetch(*positions(0, 3))
    recurrent = RecurrentCache()
    recurrent.advance(mx.ones((1, 3, 8)), mx.ones((1, 2, 4, 4)), 1)
    arrays = list(snapshot_arrays([kv.snapshot(), None, recurrent.snapshot()]))
    assert len(arrays) == 4 and sum(a.nbytes for a in arrays) == 2 * 24 * 4 + (24 + 32) * 4
