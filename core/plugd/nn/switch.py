"""Linear layers over stacked experts, for the mixture-of-experts blocks in plugd.nn.switch_mlp.

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
# How mlx-lm's MoE model files quantize their routers (a router's logits pick the experts; a shared-expert gate
# weighs the shared expert): with more precision than the rest.
ROUTER_QUANTIZATION = {"group_size": 64, "bits": 8}


def routers_at_8_bits(*suffixes: str):
    """A model's `quant_predicate`, in mlx-lm's form, for the routers whose module paths end in `suffixes`:
    `predicate(path, module)` is ROUTER_QUANTIZATION for those, True (the quantization asked for) for the rest."""

    def predicate(path: str, module: nn.Module) -> dict[str, int] | bool:
        return ROUTER_QUANTIZATION if path.endswith(suffixes) else True

    return predicate


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


def stack_experts(weights: dict[str, mx.array], prefix: str, num_experts: int) -> None:
    """Fold per-expert tensors `{prefix}.experts.{e}.{name}` into `{prefix}.switch_mlp.{name}`, lazily.

    Checkpoints saved by MLX already hold the stacked tensors and are left as
    they are. A missing expert tensor raises KeyError naming it.
    """
    first = f"{prefix}.experts.0."
    for name in [key.removeprefix(first) for key in weights if key.startswith(first)]:
        per_expert = [weights.pop(f"{prefix}.experts.{e}.{name}") for e in range(num_experts)]
        weights[f"{prefix}.switch_mlp.{name}"] = mx.stack(per_expert)
