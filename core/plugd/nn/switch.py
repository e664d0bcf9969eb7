"""Mixture-of-experts feed-forward: each token through its chosen experts, gathered in one matmul per projection.

Expert weights are stacked into one (experts, out, in) tensor per projection,
so a token's k experts are picked with `mx.gather_mm` (dense) or
`mx.gather_qmm` (quantized) instead of looping over experts.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from plugd.nn.linear import QuantizedWeight

# From this many (token, expert) pairs, sorting them by expert pays off: each expert's weights are read once.
SORT_FROM_ROWS = 64


class SwitchLinear(nn.Module):
    """One bias-free linear per expert, weights stacked as (experts, out, in)."""

    def __init__(self, in_dims: int, out_dims: int, num_experts: int):
        super().__init__()
        self.weight = mx.zeros((num_experts, out_dims, in_dims))

    def __call__(self, x: mx.array, experts: mx.array, sorted_experts: bool) -> mx.array:
        return mx.gather_mm(x, self["weight"].swapaxes(-1, -2), rhs_indices=experts, sorted_indices=sorted_experts)

    def to_quantized(self, group_size: int, bits: int) -> QuantizedSwitchLinear:
        return QuantizedSwitchLinear(self.weight.shape, group_size, bits)


class QuantizedSwitchLinear(QuantizedWeight):
    """SwitchLinear with MLX affine-quantized expert weights (see plugd.nn.linear)."""

    def __call__(self, x: mx.array, experts: mx.array, sorted_experts: bool) -> mx.array:
        return mx.gather_qmm(
            x,
            self["weight"],
            self["scales"],
            self["biases"],
            rhs_indices=experts,
            transpose=True,
            group_size=self.group_size,
            bits=self.bits,
            sorted_indices=sorted_experts,
        )


class SwitchGLU(nn.Module):
    """SwiGLU per expert, down(silu(gate(x)) * up(x)): (..., dims) and (..., k) experts -> (..., k, dims)."""

    def __init__(self, dims: int, hidden_dims: int, num_experts: int):
        super().__init__()
        self.gate_proj = SwitchLinear(dims, hidden_dims, num_experts)
        self.up_proj = SwitchLinear(dims, hidden_dims, num_experts)
        self.down_proj = SwitchLinear(hidden_dims, dims, num_experts)

    def __call__(self, x: mx.array, experts: mx.array) -> mx.array:
        # Each token becomes a one-row matrix, broadcast against its k experts.
        rows = mx.expand_dims(x, (-2, -3))
        sort = experts.size >= SORT_FROM_ROWS
        if sort:
            flat = experts.flatten()
            order = mx.argsort(flat)
            rows = rows.flatten(0, -3)[order // experts.shape[-1]]
            chosen = flat[order]
        else:
            chosen = experts
        hidden = nn.silu(self.gate_proj(rows, chosen, sort)) * self.up_proj(rows, chosen, sort)
        out = self.down_proj(hidden, chosen, sort)
        if sort:
            out = out[mx.argsort(order)].reshape(*experts.shape, *out.shape[-2:])
        return out.squeeze(-2)


def stack_experts(weights: dict[str, mx.array], prefix: str, num_experts: int) -> None:
    """Fold per-expert tensors `{prefix}.experts.{e}.{name}` into `{prefix}.switch_mlp.{name}`, lazily.

    Checkpoints saved by MLX already hold the stacked tensors and are left as
    they are. A missing expert tensor raises KeyError naming it.
    """
    first = f"{prefix}.experts.0."
    for name in [key.removeprefix(first) for key in weights if key.startswith(first)]:
        per_expert = [weights.pop(f"{prefix}.experts.{e}.{name}") for e in range(num_experts)]
        weights[f"{prefix}.switch_mlp.{name}"] = mx.stack(per_expert)
