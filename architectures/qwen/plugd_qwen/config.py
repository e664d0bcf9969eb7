"""The hybrid Qwen models' layer kinds and what each layer caches, as the daemon reads them for its memory
estimate: imported by the daemon, so no MLX here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plugd.hookspecs import LayerCache, attention_cache

LINEAR, FULL = "linear_attention", "full_attention"


def layer_types(text: Mapping[str, Any]) -> tuple[str, ...]:
    """Each layer's attention kind: `layer_types` (transformers 5), else every `full_attention_interval`-th is full."""
    if "layer_types" in text:
        kinds = tuple(text["layer_types"])
        if unknown := sorted(set(kinds) - {LINEAR, FULL}):
            raise ValueError(f"unknown layer types {unknown}; known: {LINEAR}, {FULL}")
        if len(kinds) != text["num_hidden_layers"]:
            raise ValueError(f"{len(kinds)} layer_types for {text['num_hidden_layers']} layers")
        return kinds
    interval = text.get("full_attention_interval", 4)
    return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(text["num_hidden_layers"]))


def hybrid_layers(config: Mapping[str, Any]) -> list[LayerCache]:
    """Qwen3-Next and Qwen3.5: each Gated DeltaNet layer keeps a convolution window and a float32 state of value
    heads x key dimension; each full-attention layer keys and values."""
    keys = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    values = config["linear_num_value_heads"] * config["linear_value_head_dim"]
    kernel = config.get("linear_conv_kernel_dim", 4)
    linear = LayerCache(state=(kernel - 1) * (2 * keys + values),
                        state_float32=values * config["linear_key_head_dim"])
    attention = attention_cache(config)
    return [linear if kind == LINEAR else attention for kind in layer_types(config)]
