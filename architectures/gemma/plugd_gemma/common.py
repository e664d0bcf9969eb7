"""What Gemma 3 and Gemma 4 text models share: rotary settings per layer type, scaled embeddings, soft-capping
and attention over a full or sliding-window cache (which layers slide: plugd_gemma.config).

Configs come in two vintages. Older ones give the rotary bases as
`rope_theta` (global layers, with `rope_scaling`) and `rope_local_base_freq`
(sliding layers); transformers 5 lists `layer_types` and nests one
`rope_parameters` entry per layer type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from plugd.nn.attention import scaled_dot_product_attention
from plugd.nn.cache import KVCache
from plugd.nn.rotating import RotatingKVCache, window_mask
from plugd_gemma.config import FULL, SLIDING
from plugd_gemma.spans import Span, span_mask


@dataclass(frozen=True)
class RopeSettings:
    """Rotary embedding of one layer type: base, kind ("default", "linear" or "proportional"), scaling factor
    and the fraction of each head's features rotated."""

    theta: float
    kind: str = "default"
    factor: float = 1.0
    rotated_fraction: float = 1.0

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any], theta: float) -> RopeSettings:
        kind = entry.get("rope_type", entry.get("type", "default"))
        if kind not in ("default", "linear", "proportional"):
            raise ValueError(f"rope_type {kind!r} is not supported for Gemma")
        return cls(
            theta=float(entry.get("rope_theta", theta)),
            kind=kind,
            factor=float(entry.get("factor", 1.0)),
            rotated_fraction=float(entry.get("partial_rotary_factor", 1.0)),
        )


def rope_settings(config: Mapping[str, Any], defaults: Mapping[str, Mapping[str, Any]]) -> dict[str, RopeSettings]:
    """RopeSettings per layer type from either vintage, falling back on `defaults` (per layer type) where silent."""
    nested = config.get("rope_parameters") or {}
    if FULL in nested or SLIDING in nested:
        return {kind: RopeSettings.from_dict({**defaults[kind], **nested.get(kind, {})}, 10000.0) for kind in (FULL, SLIDING)}
    full = {**defaults[FULL], **(config.get("rope_scaling") or {}), **nested}
    if "rope_theta" in config:
        full["rope_theta"] = config["rope_theta"]
    sliding = dict(defaults[SLIDING])
    if "rope_local_base_freq" in config:
        sliding["rope_theta"] = config["rope_local_base_freq"]
    return {FULL: RopeSettings.from_dict(full, 1e6), SLIDING: RopeSettings.from_dict(sliding, 10000.0)}


class GemmaRoPE:
    """Rotates (..., length, head_dim) queries or keys by position, half-split layout.

    "linear" divides positions by `factor`; "proportional" rotates only the
    first `rotated_fraction` of the features, at the frequencies they would
    have in a fully rotated head (the rest get an infinite period).
    """

    def __init__(self, head_dim: int, settings: RopeSettings, traditional: bool = False):
        self.head_dim, self.traditional = head_dim, traditional
        self.base: float | None = settings.theta
        self.scale = 1.0 / settings.factor if settings.kind == "linear" else 1.0
        self.freqs: mx.array | None = None
        if settings.kind == "proportional":
            rotated = int(head_dim * settings.rotated_fraction)
            exponents = mx.arange(0, rotated, 2, dtype=mx.float32) / head_dim
            unrotated = mx.full(((head_dim - rotated) // 2,), mx.inf)
            self.freqs = mx.concatenate([settings.factor * settings.theta**exponents, unrotated])
            self.base = None

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        return mx.fast.rope(
            x, self.head_dim, traditional=self.traditional, base=self.base, scale=self.scale, offset=offset,
            freqs=self.freqs,
        )


def embedding_scale(hidden_size: int, dtype: mx.Dtype) -> mx.array:
    """sqrt(hidden_size) rounded to bfloat16, as the checkpoints' own bfloat16 computation multiplies by it."""
    return mx.array(hidden_size**0.5, mx.bfloat16).astype(dtype)


def soft_cap(x: mx.array, cap: float | None) -> mx.array:
    """cap * tanh(x / cap): squashes into (-cap, cap); unchanged when no cap is configured."""
    return x if cap is None else mx.tanh(x / cap) * cap


def make_layer_cache(kind: str, window: int) -> KVCache | RotatingKVCache:
    return RotatingKVCache(window) if kind == SLIDING else KVCache()


def attend(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, window: int | None, cache,
    spans: Sequence[Span] = (), offset: int = 0,
) -> tuple[mx.array, tuple[mx.array, mx.array, Any]]:
    """Attention of (batch, heads, length, head_dim) queries at `offset` over the cache (when given) plus the new
    keys and values, causal, and within `window` positions for sliding layers; `spans` of media positions (relative
    to `offset`) see each other in both directions. Returns the output and the (keys, values, mask) it used, which
    Gemma 4's KV-sharing layers attend over as they are."""
    length = queries.shape[2]
    if cache is not None:
        keys, values = cache.update_and_fetch(keys, values)
    if spans:
        mask = span_mask(offset, length, keys.shape[2], window, spans)
    elif cache is not None:
        mask = cache.mask(length)
    elif window is None:
        mask = "causal" if length > 1 else None
    else:
        mask = window_mask(0, length, 0, length, window)
    return attend_shared(queries, (keys, values, mask), scale), (keys, values, mask)


def attend_shared(queries: mx.array, shared: tuple[mx.array, mx.array, Any], scale: float) -> mx.array:
    keys, values, mask = shared
    return scaled_dot_product_attention(queries, keys, values, scale, mask)
