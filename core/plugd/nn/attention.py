"""Grouped-query scaled dot-product attention."""

from __future__ import annotations

import mlx.core as mx


def attend(queries: mx.array, keys: mx.array, values: mx.array, scale: float) -> mx.array:
    """Attention over (batch, heads, length, head_dim) tensors.

    Keys and values may have fewer heads than queries (grouped-query
    attention); the kernel shares each key/value head across its group of
    query heads. A multi-token query is masked causally with its last row
    aligned to the last key, so a prompt chunk appended to cached keys sees
    the whole cache plus its own past. A single token sees every key.
    """
    mask = "causal" if queries.shape[2] > 1 else None
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)
