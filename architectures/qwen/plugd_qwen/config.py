"""The hybrid Qwen models' layer kinds and what each layer caches, as the daemon reads them for its memory
estimate, and how many tokens an image takes in a Qwen3.5 prompt: imported by the daemon, so no MLX here."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from plugd.hookspecs import LayerCache, MediaTokens, attention_cache

LINEAR, FULL = "linear_attention", "full_attention"
# The image processor Qwen3.5 checkpoints name (Qwen2-VL's) with their preprocessor_config.json's settings: each
# image resized to between these many pixels, each side a multiple of patch_size * spatial_merge_size.
MIN_PIXELS, MAX_PIXELS = 65_536, 16_777_216
MAX_ASPECT_RATIO = 200
IMAGE_PAD = "<|image_pad|>"
IMAGE_TOKEN_ID = 248_056


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


def qwen3_5_vision_settings(config: Mapping[str, Any]) -> tuple[int, int]:
    """(patch_size, spatial_merge_size) of a Qwen3.5 config.json's vision tower; Qwen3_5VisionConfig's defaults."""
    vision = config.get("vision_config") or {}
    return vision.get("patch_size", 16), vision.get("spatial_merge_size", 2)


def qwen3_5_resized(width: int, height: int, factor: int) -> tuple[int, int]:
    """(width, height) Qwen3.5's processor resizes an image to: each side rounded to a multiple of `factor`, then
    scaled (aspect ratio kept) into [MIN_PIXELS, MAX_PIXELS]; ValueError for an image more than 200 times wider
    than high, or the reverse, which the processor refuses."""
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise ValueError(f"a {width}x{height} image is more than {MAX_ASPECT_RATIO} times wider than high, or the "
                         "reverse")
    new_width, new_height = round(width / factor) * factor, round(height / factor) * factor
    if new_width * new_height > MAX_PIXELS:
        scale = math.sqrt(width * height / MAX_PIXELS)
        new_width = max(factor, math.floor(width / scale / factor) * factor)
        new_height = max(factor, math.floor(height / scale / factor) * factor)
    elif new_width * new_height < MIN_PIXELS:
        scale = math.sqrt(MIN_PIXELS / (width * height))
        new_width = math.ceil(width * scale / factor) * factor
        new_height = math.ceil(height * scale / factor) * factor
    return new_width, new_height


def qwen3_5_media_tokens(config: Mapping[str, Any]) -> MediaTokens:
    """Qwen3.5's renderers write "<|vision_start|><|image_pad|><|vision_end|>" for an image; the prompt holds one
    "<|image_pad|>" per merged patch of the resized image."""
    patch, merge = qwen3_5_vision_settings(config)

    def expansion(width: int, height: int) -> str:
        new_width, new_height = qwen3_5_resized(width, height, patch * merge)
        return IMAGE_PAD * ((new_width // patch) * (new_height // patch) // merge**2)

    return MediaTokens(placeholder=IMAGE_PAD, expansion=expansion, token_id=config.get("image_token_id", IMAGE_TOKEN_ID))
