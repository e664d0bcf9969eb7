"""Media spans in a Gemma forward: positions whose input embeddings come from an image (plugd.nn.media), and that
attend to each other in both directions.

A span is (start, length) within one call's positions. As transformers builds
Gemma 3's masks from token_type_ids: a full-attention layer lets a query see
a key when the key is not later (causal) or both lie in the same span; a
sliding layer additionally requires the key to be fewer than `window`
positions before the query (later keys of the query's own span stay visible).
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

Span = tuple[int, int]


def spans_of(media: Sequence[tuple[int, mx.array]]) -> tuple[Span, ...]:
    return tuple((start, rows.shape[0]) for start, rows in media)


def span_mask(first_query: int, queries: int, keys: int, window: int | None, spans: Sequence[Span]) -> mx.array:
    """Which of `keys` consecutive positions (the last being the last query) each of `queries` positions starting at
    `first_query` may see, with `spans` (relative to `first_query`) bidirectional."""
    query_positions = mx.arange(first_query, first_query + queries)[:, None]
    key_positions = mx.arange(first_query + queries - keys, first_query + queries)[None]
    allowed = key_positions <= query_positions
    for start, length in spans:
        begin, end = first_query + start, first_query + start + length
        in_query = (query_positions >= begin) & (query_positions < end)
        in_key = (key_positions >= begin) & (key_positions < end)
        allowed = allowed | (in_query & in_key)
    if window is not None:
        allowed = allowed & (key_positions > query_positions - window)
    return allowed
