"""Dense and MLX-affine-quantized linear layers and embeddings.

A checkpoint quantized by MLX stores a dense weight of shape (..., in) as
`weight`, packed into uint32 words of shape (..., in * bits / 32), and one
`scales` and one `biases` per group of `group_size` inputs, shape
(..., in / group_size). Each dense layer's `to_quantized(group_size, bits)`
returns its quantized twin, shaped to take those tensors.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


class Linear(nn.Module):
    """y = x W^T without bias, with W shaped (out, in) as checkpoints store it."""

    def __init__(self, in_dims: int, out_dims: int):
        super().__init__()
        self.weight = mx.zeros((out_dims, in_dims))

    def __call__(self, x: mx.array) -> mx.array:
        return x @ self["weight"].T

    def to_quantized(self, group_size: int, bits: int) -> QuantizedLinear:
        return QuantizedLinear(self.weight.shape, group_size, bits)


class TowerLinear(nn.Module):
    """y = x W^T (+ b), W shaped (out, in), with no quantized twin: quantizing a model leaves it at the
    checkpoint's precision, as vision towers stay."""

    def __init__(self, in_dims: int, out_dims: int, bias: bool = True):
        super().__init__()
        self.weight = mx.zeros((out_dims, in_dims))
        if bias:
            self.bias = mx.zeros((out_dims,))

    def __call__(self, x: mx.array) -> mx.array:
        if "bias" in self:
            return mx.addmm(self["bias"], x, self["weight"].T)
        return x @ self["weight"].T


class Embedding(nn.Module):
    """Token id -> row of a (vocab, dims) table; `as_linear` projects onto the vocabulary with the same table."""

    def __init__(self, vocab_size: int, dims: int):
        super().__init__()
        self.weight = mx.zeros((vocab_size, dims))

    def __call__(self, tokens: mx.array) -> mx.array:
        return self["weight"][tokens]

    def as_linear(self, x: mx.array) -> mx.array:
        return x @ self["weight"].T

    def to_quantized(self, group_size: int, bits: int) -> QuantizedEmbedding:
        return QuantizedEmbedding(self.weight.shape, group_size, bits)


class QuantizedWeight(nn.Module):
    """Base of the quantized layers: a weight held in MLX's affine-quantized form, used without unpacking it."""

    def __init__(self, dense_shape: tuple[int, ...], group_size: int, bits: int):
        super().__init__()
        *leading, in_dims = dense_shape
        if in_dims % group_size or (in_dims * bits) % 32:
            raise ValueError(f"{in_dims} inputs cannot be quantized in groups of {group_size} at {bits} bits")
        self.group_size, self.bits = group_size, bits
        self.weight = mx.zeros((*leading, in_dims * bits // 32), mx.uint32)
        self.scales = mx.zeros((*leading, in_dims // group_size))
        self.biases = mx.zeros((*leading, in_dims // group_size))

    def _matmul_transposed(self, x: mx.array) -> mx.array:
        weight, scales, biases = self["weight"], self["scales"], self["biases"]
        return mx.quantized_matmul(
            x, weight, scales, biases, transpose=True, group_size=self.group_size, bits=self.bits
        )


class QuantizedLinear(QuantizedWeight):
    def __call__(self, x: mx.array) -> mx.array:
        return self._matmul_transposed(x)


class QuantizedEmbedding(QuantizedWeight):
    def __call__(self, tokens: mx.array) -> mx.array:
        return mx.dequantize(
            self["weight"][tokens],
            self["scales"][tokens],
            self["biases"][tokens],
            group_size=self.group_size,
            bits=self.bits,
        )

    def as_linear(self, x: mx.array) -> mx.array:
        return self._matmul_transposed(x)
