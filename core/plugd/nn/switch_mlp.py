"""Mixture-of-experts feed-forward blocks with the activation as a parameter, each token through its chosen experts:

- SwitchMLP, fc2(act(fc1(x))) per expert (Nemotron-H's relu^2 experts), named as MLX-converted checkpoints name
  them (`switch_mlp.fc1.weight`, `switch_mlp.fc2.weight`);
- SwitchGLU, down(act(gate(x)) * up(x)) per expert: SwiGLU with silu (Qwen), GeGLU with gelu_approx (Gemma 4),
  named `gate_proj`, `up_proj`, `down_proj`.

Experts are stacked as in plugd.nn.switch.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from plugd.nn.sharding import split_inputs, split_outputs
from plugd.nn.switch import SORT_FROM_ROWS, SwitchLinear


class ExpertRows:
    """Each token as a one-row matrix per chosen expert, sorted by expert when there are enough (token, expert)
    pairs for reading each expert's weights once to pay off; `restore` puts results back in token order."""

    def __init__(self, x: mx.array, experts: mx.array):
        self.shape = experts.shape
        self.rows = mx.expand_dims(x, (-2, -3))
        self.experts = experts
        self.order: mx.array | None = None
        if experts.size >= SORT_FROM_ROWS:
            flat = experts.flatten()
            self.order = mx.argsort(flat)
            self.rows = self.rows.flatten(0, -3)[self.order // experts.shape[-1]]
            self.experts = flat[self.order]

    @property
    def sorted(self) -> bool:
        return self.order is not None

    def restore(self, out: mx.array) -> mx.array:
        """(..., k, dims) results in the tokens' order, from one row per (token, expert) pair as computed."""
        if self.order is not None:
            out = out[mx.argsort(self.order)].reshape(*self.shape, *out.shape[-2:])
        return out.squeeze(-2)


class SwitchMLP(nn.Module):
    """(..., dims) and (..., k) experts -> (..., k, dims): fc2(activation(fc1(x))) through each chosen expert."""

    def __init__(self, dims: int, hidden_dims: int, num_experts: int, activation: Callable[[mx.array], mx.array]):
        super().__init__()
        self.activation = activation
        self.fc1 = SwitchLinear(dims, hidden_dims, num_experts)
        self.fc2 = SwitchLinear(hidden_dims, dims, num_experts)

    def __call__(self, x: mx.array, experts: mx.array) -> mx.array:
        routed = ExpertRows(x, experts)
        hidden = self.activation(self.fc1(routed.rows, routed.experts, routed.sorted))
        return routed.restore(self.fc2(hidden, routed.experts, routed.sorted))

    def shard(self, group: mx.distributed.Group) -> None:
        """As SwitchGLU's: each rank keeps a share of every expert's hidden units."""
        split_outputs(self.fc1, group)
        split_inputs(self.fc2, group)


class SwitchGLU(nn.Module):
    """(..., dims) and (..., k) experts -> (..., k, dims): down(activation(gate(x)) * up(x)) through each chosen expert."""

    def __init__(
        self, dims: int, hidden_dims: int, num_experts: int, activation: Callable[[mx.array], mx.array] = nn.silu
    ):
        super().__init__()
        self.activation = activation
        self.gate_proj = SwitchLinear(dims, hidden_dims, num_experts)
        self.up_proj = SwitchLinear(dims, hidden_dims, num_experts)
        self.down_proj = SwitchLinear(hidden_dims, dims, num_experts)

    def __call__(self, x: mx.array, experts: mx.array) -> mx.array:
        routed = ExpertRows(x, experts)
        rows, chosen, sort = routed.rows, routed.experts, routed.sorted
        hidden = self.activation(self.gate_proj(rows, chosen, sort)) * self.up_proj(rows, chosen, sort)
        return routed.restore(self.down_proj(hidden, chosen, sort))

    def shard(self, group: mx.distributed.Group) -> None:
        """Each rank keeps a share of every expert's hidden units (so every expert, and no routing across
        ranks); its output is its part of the sum (plugd.nn.sharding)."""
        split_outputs(self.gate_proj, group)
        split_outputs(self.up_proj, group)
        split_inputs(self.down_proj, group)
