"""Reading a Nemotron-H config.json of either vintage; MLX-free, as the daemon reads it too (for the memory
estimate's `cache_layers`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plugd.hookspecs import LayerCache, attention_cache

MAMBA, ATTENTION, MLP, MOE = "M", "*", "-", "E"
BLOCK_NAMES = {
    "linear_attention": MAMBA,
    "mamba": MAMBA,
    "full_attention": ATTENTION,
    "attention": ATTENTION,
    "mlp": MLP,
    "moe": MOE,
}
# Config keys transformers still reads under their older names.
OLDER_NAMES = {"n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv", "time_step_limit": "mamba_dt_limit",
               "use_conv_bias": "mamba_conv_bias"}
# transformers reads use_bias for the Mamba2 projections, mlx-lm mamba_proj_bias.
BIASES = ("attention_bias", "mlp_bias", "mamba_proj_bias", "use_bias")


def read(config: Mapping[str, Any], key: str, default: Any = None) -> Any:
    if key in config:
        return config[key]
    return config.get(OLDER_NAMES.get(key, key), default)


def number(value: Any) -> float:
    """A float from config.json, where mlx-lm's convert writes infinities as {"__float__": "Infinity"}."""
    return float(value["__float__"] if isinstance(value, dict) else value)


def block_pattern(config: Mapping[str, Any]) -> str:
    """One character per layer ("M", "*", "-", "E") from a config of either vintage."""
    names = config.get("layers_block_type") or config.get("layer_types")
    if names is not None:
        if unknown := sorted(set(names) - BLOCK_NAMES.keys()):
            raise ValueError(f"unknown layer types {unknown}; known: {sorted(BLOCK_NAMES)}")
        return "".join(BLOCK_NAMES[name] for name in names)
    pattern = config.get("hybrid_override_pattern")
    if pattern is None:
        raise ValueError("config.json has none of hybrid_override_pattern, layers_block_type, layer_types")
    pattern = "".join(pattern)
    if unknown := sorted(set(pattern) - set(BLOCK_NAMES.values())):
        raise ValueError(f"unknown hybrid_override_pattern characters {unknown}")
    return pattern


def cache_layers(config: Mapping[str, Any]) -> list[LayerCache]:
    """What each layer caches: a Mamba2 layer its convolution window (over the inner features and the groups' B
    and C) and a float32 state of inner features x state size; an attention layer keys and values; MLP and MoE
    layers nothing."""
    inner = config["mamba_num_heads"] * config["mamba_head_dim"]
    state, groups = config["ssm_state_size"], read(config, "n_groups", 8)
    mamba = LayerCache(state=(read(config, "conv_kernel", 4) - 1) * (inner + 2 * groups * state),
                       state_float32=inner * state)
    kinds = {MAMBA: mamba, ATTENTION: attention_cache(config), MLP: LayerCache(), MOE: LayerCache()}
    return [kinds[kind] for kind in block_pattern(config)]
