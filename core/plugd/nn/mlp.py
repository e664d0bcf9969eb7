"""The gated feed-forward block most decoders use: SwiGLU with silu, GeGLU with gelu_approx."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from plugd.nn.activations import silu
from plugd.nn.linear import Linear
from plugd.nn.sharding import split_inputs, split_outputs


class GatedMLP(nn.Module):
    """down(activation(gate(x)) * up(x)), with the checkpoint names gate_proj, up_proj and down_proj."""

    def __init__(self, dims: int, hidden_dims: int, activation: Callable[[mx.array], mx.array] = silu):
        super().__init__()
        self.gate_proj = Linear(dims, hidden_dims)
        self.up_proj = Linear(dims, hidden_dims)
        self.down_proj = Linear(hidden_dims, dims)
        self.activation = activation

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(self.activation(self.gate_proj(x)) * self.up_proj(x))

    def shard(self, group: mx.distributed.Group) -> None:
        """Each rank keeps a share of the hidden units; its output is its part of the sum (plugd.nn.sharding)."""
        split_outputs(self.gate_proj, group)
        split_outputs(self.up_proj, group)
        split_inputs(self.down_proj, group)
