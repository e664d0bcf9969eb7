"""Root-mean-square and (mean-centred) layer normalisation."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last axis."""

    def __init__(self, dims: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = mx.ones((dims,))

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, self["weight"], self.eps)


class LayerNorm(nn.Module):
    """(x - mean(x)) / std(x) * weight + bias over the last axis."""

    def __init__(self, dims: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = mx.ones((dims,))
        self.bias = mx.zeros((dims,))

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.layer_norm(x, self["weight"], self["bias"], self.eps)
