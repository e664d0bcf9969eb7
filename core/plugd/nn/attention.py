"""Scaled dot-product attention, and grouped-query attention over a causal cache."""

from __future__ import annotations

import mlx.core as mx

from plugd.nn.host import host_allowed, traceable
from plugd.nn.host_attention import host_attention

__all__ = ["HOST_DECODE_MIN_KEYS", "TOWER_SCORES", "attend", "attend_all", "scaled_dot_product_attention",
           "traceable"]

# A single-token query (a decode step) leaves MLX from this many keys on. Below it the host path's syncs (one per
# key/value head and layer) cost about what its faster exp saves; from it on, a 24-layer Qwen3 with 12 heads
# decoded 15-20% faster at 2-4k tokens of context and 28% faster at 8k (156 vs 217 ms a token).
HOST_DECODE_MIN_KEYS = 2048
# The most attention scores (all heads and rows together) `attend_all` lets exist at once: 256 MiB in float32. A
# vision tower attends over every patch of an image, up to 65,536 for Qwen3.5's largest; head dims MLX has no fused
# kernel for (Qwen3.5's 72) would otherwise hold all 16 heads' 65,536 x 65,536 scores.
TOWER_SCORES = 1 << 26


def scaled_dot_product_attention(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: mx.array | str | None = None
) -> mx.array:
    """`mx.fast.scaled_dot_product_attention`, except that on the CPU a multi-token query, or one token over a long
    cache, has its softmax computed by numpy (plugd.nn.host_attention), several times faster there and equal to
    float32 rounding."""
    on_host = queries.shape[2] > 1 or keys.shape[2] >= HOST_DECODE_MIN_KEYS
    if on_host and host_allowed():
        return host_attention(queries, keys, values, scale, mask)
    if queries.shape[2] == 1 and mx.default_device().type == mx.DeviceType.cpu:
        return _grouped_attention(queries, keys, values, scale, mask)
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)


def _grouped_attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float,
                       mask: mx.array | None) -> mx.array:
    """One query position per row, each key/value head's group of query heads in one product, as plain MLX
    operations: on a CPU, where `mx.fast.scaled_dot_product_attention` has no fused kernel, they give the same
    result in two thirds of the time (8 rows of 12 heads over 300 keys: 0.74 against 1.09 ms a layer)."""
    batch, heads, _, head_dim = queries.shape
    kv_heads = keys.shape[1]
    scores = (queries.reshape(batch, kv_heads, heads // kv_heads, head_dim) * scale) @ keys.swapaxes(-1, -2)
    if mask is not None:
        if mask.ndim == 4 and mask.shape[1] == heads:  # one per query head: laid out as the scores are
            mask = mask.reshape(mask.shape[0], kv_heads, heads // kv_heads, -1)
        scores = mx.where(mask, scores, -mx.inf) if mask.dtype == mx.bool_ else scores + mask
    weights = mx.softmax(scores.astype(mx.float32), axis=-1, precise=True).astype(values.dtype)
    return (weights @ values).reshape(batch, heads, 1, head_dim)


def attend(queries: mx.array, keys: mx.array, values: mx.array, scale: float, cache=None) -> mx.array:
    """Attention over (batch, heads, length, head_dim) tensors, `keys` and `values` being what `cache` (if any)
    returned from its update.

    Keys and values may have fewer heads than queries (grouped-query
    attention); the kernel shares each key/value head across its group of
    query heads. The cache says what each query may see (`cache.mask`): a
    single sequence's, causally with the last query aligned to the last key,
    so a prompt chunk appended to cached keys sees the whole cache plus its
    own past; a batch's (plugd.nn.batch_cache), also none of a row's padding.
    Without a cache a multi-token query is causal.
    """
    length = queries.shape[2]
    if cache is not None:
        mask = cache.mask(length)
    else:
        mask = "causal" if length > 1 else None
    return scaled_dot_product_attention(queries, keys, values, scale, mask)


def attend_all(queries: mx.array, keys: mx.array, values: mx.array, scale: float,
               max_scores: int = TOWER_SCORES) -> mx.array:
    """Attention of every query to every key (no mask, as a vision tower's), over (batch, heads, length, head_dim)
    tensors, the queries a block at a time, each evaluated before the next, so that at most `max_scores` scores
    exist at once. Each query's softmax is its own, so blocks give what one pass gives."""
    batch, heads, length, _ = queries.shape
    block = max(1, max_scores // (batch * heads * keys.shape[2]))
    if block >= length:
        return scaled_dot_product_attention(queries, keys, values, scale)
    parts = []
    for start in range(0, length, block):
        parts.append(scaled_dot_product_attention(queries[:, :, start : start + block], keys, values, scale))
        mx.eval(parts[-1])
    return mx.concatenate(parts, axis=2)
