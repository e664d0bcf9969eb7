"""Embedding in the runner: the model's last hidden states pooled, projected and normalised as its
sentence-transformers layout declares (plugd.store.sentence_layout), inputs batched by length.

Inputs are sorted by length and cut into batches of at most EMBED_BATCH_TOKENS padded positions
(plugd.protocol.embed_batches), each row padded at its end; the model's `hidden_states(tokens, lengths)` keeps
the padding from the real positions (a causal model by its causality, a bidirectional one by its mask), and
pooling reads only the row's own positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from plugd.protocol import embed_batches
from plugd.runner.errors import CheckpointError
from plugd.store.sentence_layout import DenseLayer, EmbeddingLayout

_ACTIVATIONS = {"identity": lambda x: x, "tanh": mx.tanh, "sigmoid": mx.sigmoid, "relu": nn.relu, "gelu": nn.gelu}


class Embedder:
    def __init__(self, model: nn.Module, layout: EmbeddingLayout, model_dir: Path):
        if not hasattr(model, "hidden_states"):
            raise CheckpointError(f"{type(model).__module__} gives no hidden states: it cannot embed")
        self.model, self.layout = model, layout
        self.dense = [_Dense(layer, Path(model_dir)) for layer in layout.dense]

    def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One vector per input, in order; ValueError for an empty input."""
        if any(not tokens for tokens in inputs):
            raise ValueError("an input has no tokens")
        vectors: dict[int, list[float]] = {}
        for batch in embed_batches([len(tokens) for tokens in inputs]):
            rows = self._embed_batch([inputs[i] for i in batch])
            vectors |= dict(zip(batch, rows.tolist(), strict=True))
        return [vectors[i] for i in range(len(inputs))]

    def _embed_batch(self, rows: list[Sequence[int]]) -> mx.array:
        width = max(len(row) for row in rows)
        tokens = mx.array([list(row) + [0] * (width - len(row)) for row in rows], mx.int32)
        lengths = mx.array([len(row) for row in rows])
        hidden = self.model.hidden_states(tokens, lengths).astype(mx.float32)
        pooled = mx.concatenate([_pool(mode, hidden, lengths) for mode in self.layout.pooling], axis=-1)
        for dense in self.dense:
            pooled = dense(pooled)
        if self.layout.normalize:
            pooled = pooled / mx.maximum(mx.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
        mx.eval(pooled)
        return pooled


def _pool(mode: str, hidden: mx.array, lengths: mx.array) -> mx.array:
    """(batch, length, dims) hidden states -> (batch, dims), over each row's first `lengths` positions."""
    positions = mx.arange(hidden.shape[1])[None, :]
    mask = (positions < lengths[:, None])[..., None]
    count = lengths[:, None].astype(mx.float32)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        return mx.take_along_axis(hidden, (lengths - 1)[:, None, None], axis=1)[:, 0]
    if mode == "max":
        return mx.where(mask, hidden, -mx.inf).max(axis=1)
    if mode == "weightedmean":
        weights = mx.where(mask[..., 0], (positions + 1).astype(mx.float32), 0.0)[..., None]
        return (hidden * weights).sum(axis=1) / weights.sum(axis=1)
    summed = mx.where(mask, hidden, 0.0).sum(axis=1)
    return summed / (count if mode == "mean" else mx.sqrt(count))  # "mean_sqrt_len_tokens"


class _Dense:
    """A sentence-transformers Dense: activation(x @ weight.T + bias), weights from its folder's safetensors."""

    def __init__(self, layer: DenseLayer, model_dir: Path):
        try:
            tensors = mx.load(str(model_dir / layer.weights))
        except (OSError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{layer.weights}: {exc}") from None
        self.weight = tensors.get("linear.weight")
        self.bias = tensors.get("linear.bias") if layer.bias else None
        if self.weight is None or tuple(self.weight.shape) != (layer.out_features, layer.in_features):
            raise CheckpointError(f"{layer.weights} holds no linear.weight of shape "
                                  f"({layer.out_features}, {layer.in_features})")
        if layer.bias and self.bias is None:
            raise CheckpointError(f"{layer.weights} holds no linear.bias")
        self.weight = self.weight.astype(mx.float32)
        self.activation = _ACTIVATIONS[layer.activation]

    def __call__(self, x: mx.array) -> mx.array:
        y = x @ self.weight.T
        return self.activation(y if self.bias is None else y + self.bias.astype(mx.float32))
