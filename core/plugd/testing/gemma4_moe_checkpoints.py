"""A tiny Gemma 4 mixture-of-experts checkpoint (the 26B-A4B's shape), registered into plugd.testing.checkpoints.

    write_checkpoint(tmp_path / "m", "gemma4_text_moe")

It is a gemma4_text checkpoint (config.json says so) with `enable_moe_block`:
every layer holds the dense MLP plus a router and fused expert tensors as
transformers 5 writes them (`experts.gate_up_proj`, `experts.down_proj`), and
like the 26B-A4B no per-layer inputs, no KV-sharing layers, and keys doubling
as values in the global layers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plugd.testing import gemma_checkpoints

Shapes = dict[str, tuple[int, ...]]

BASE_CONFIGS: dict[str, dict[str, Any]] = {
    "gemma4_text_moe": {
        **gemma_checkpoints.BASE_CONFIGS["gemma4_text"],
        "enable_moe_block": True,
        "num_experts": 8,
        "top_k_experts": 2,
        "moe_intermediate_size": 32,
        "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0,
        "use_double_wide_mlp": False,
        "attention_k_eq_v": True,
    }
}


def _gemma4_text_shapes(c: dict[str, Any]) -> Shapes:
    """gemma4_text's tensors, plus each layer's experts where the config enables them."""
    shapes = gemma_checkpoints.SHAPES["gemma4_text"](c)
    if not c.get("enable_moe_block"):
        return shapes
    h, experts, hidden = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "router.proj.weight": (experts, h),
            p + "router.scale": (h,),
            p + "router.per_expert_scale": (experts,),
            p + "experts.gate_up_proj": (experts, 2 * hidden, h),
            p + "experts.down_proj": (experts, h, hidden),
            p + "pre_feedforward_layernorm_2.weight": (h,),
            p + "post_feedforward_layernorm_1.weight": (h,),
            p + "post_feedforward_layernorm_2.weight": (h,),
        }
    return shapes


SHAPES: dict[str, Callable[[dict[str, Any]], Shapes]] = {"gemma4_text": _gemma4_text_shapes}
