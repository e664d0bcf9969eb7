"""The attention KV cache's storage grows with use, geometrically up to the context it was told of, never to the
whole context at once: a large default context costs only what its positions use."""

import mlx.core as mx

from plugd.nn.cache import KVCache

CONTEXT = 32768


def positions(length: int, start: int = 0) -> mx.array:
    return mx.broadcast_to(mx.arange(start, start + length, dtype=mx.float32)[None, None, :, None], (1, 2, length, 4))


def capacities(cache: KVCache, lengths: list[int]) -> list[int]:
    """The cache's storage, in positions, after each write of these lengths."""
    seen, start = [], cache.offset
    for length in lengths:
        cache.update_and_fetch(positions(length, start), positions(length, start))
        start += length
        seen.append(cache.keys.shape[2])
    return seen


def test_storage_grows_with_use_not_to_the_context_at_once():
    cache = KVCache(step=256)
    cache.reserve(CONTEXT)
    assert capacities(cache, [512]) == [512]  # a first prefill chunk takes its own room, not 32,768 positions
    assert capacities(cache, [1] * 600)[-1] == 2048  # 512 -> 1024 -> 2048: each growth doubles


def test_growth_doubles_so_decoding_rarely_reallocates_and_stops_at_the_context():
    cache = KVCache(step=256)
    cache.reserve(5000)
    seen = capacities(cache, [1] * 5000)
    growths = sorted(set(seen))
    assert growths == [256, 512, 1024, 2048, 4096, 5120]  # the last capped at the context (in whole steps)
    keys, values = cache.update_and_fetch(positions(1, 5000), positions(1, 5000))  # past it (a caller's slip) still grows
    assert keys.shape[2] == 5001 and [int(p) for p in keys[0, 0, -3:, 0].tolist()] == [4998, 4999, 5000]


def test_growth_keeps_every_position_and_a_trim_then_rewrite():
    cache = KVCache(step=4)
    cache.reserve(64)
    capacities(cache, [3, 5, 9])
    assert cache.trim(2) == 2
    keys, _ = cache.update_and_fetch(positions(20, 15), positions(20, 15))
    assert [int(p) for p in keys[0, 0, :, 0].tolist()] == list(range(35))
    assert cache.keys.shape[2] == 40  # 4 -> 8 -> 20 (17 needed), then 35 needed: doubled, 40


def test_without_a_reserved_context_it_grows_a_step_at_a_time():
    cache = KVCache(step=256)
    assert sorted(set(capacities(cache, [1] * 700))) == [256, 512, 768]


def test_a_completion_expected_to_reach_a_length_is_allocated_it_at_once_within_the_context():
    cache = KVCache(step=256)
    cache.reserve(CONTEXT, expected=2006)  # a prompt and the output it asks for
    assert capacities(cache, [6] + [1] * 2000)[0] == 2048  # at its first growth: decoding never reallocates
    assert cache.keys.shape[2] == 2048
    cache = KVCache(step=256)
    cache.reserve(1000, expected=5000)  # never past the context
    assert capacities(cache, [6]) == [1024]


def test_storage_kept_from_an_earlier_completion_grows_at_the_first_write_of_the_next():
    cache = KVCache(step=256)
    cache.reserve(CONTEXT, expected=70)
    capacities(cache, [6] + [1] * 64)
    cache.trim(cache.offset)  # the next prompt shares nothing
    cache.reserve(CONTEXT, expected=2006)
    assert capacities(cache, [6]) == [2048]  # grown at its prefill, not part-way through decoding
