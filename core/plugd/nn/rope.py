"""Standard (unscaled) rotary position embeddings, and rotation by angles a model computes itself (positions of
more than one axis)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx


def rope_base(config: Mapping[str, Any]) -> float:
    """The RoPE base (theta) of a config.json of either vintage.

    Older configs carry `rope_theta` (and `rope_scaling` for scaled variants);
    transformers 5 nests both under `rope_parameters`. Scaled variants (yarn,
    linear, ...) are refused rather than silently run unscaled.
    """
    parameters = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or parameters
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind != "default":
        raise ValueError(f"rope_type {kind!r} is not supported, only standard RoPE")
    base = config.get("rope_theta", parameters.get("rope_theta"))
    if base is None:
        raise ValueError("config.json has neither rope_theta nor rope_parameters.rope_theta")
    return float(base)


@dataclass(frozen=True)
class RoPE:
    """Rotates the first `dims` features of (..., length, head_dim) queries or keys by position, half-split layout."""

    dims: int
    base: float

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        return mx.fast.rope(x, self.dims, traditional=False, base=self.base, scale=1.0, offset=offset)


def rotate(x: mx.array, angles: mx.array) -> mx.array:
    """The first `2 * k` features of (..., length, head_dim) `x` rotated half-split, feature i with feature i + k,
    by `angles` (length, k) (broadcast over the leading axes), computed in float32; the rest as they are."""
    half = angles.shape[-1]
    cos, sin = mx.cos(angles), mx.sin(angles)
    first, second, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    first32, second32 = first.astype(mx.float32), second.astype(mx.float32)
    turned = [first32 * cos - second32 * sin, second32 * cos + first32 * sin]
    return mx.concatenate([*(part.astype(x.dtype) for part in turned), rest], axis=-1)
