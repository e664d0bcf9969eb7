"""The hybrid Qwen models' layer kinds and what each layer caches, as the daemon reads them for its memory
estimate, and how many tokens an image takes in a Qwen3.5 prompt: imported by the daemon, so no MLX here."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from plugd.hookspecs import IMAGE_PROCESSOR, LayerCache, MediaTokens, attention_cache

LINEAR, FULL = "linear_attention", "full_attention"
# The image processor Qwen3.5 checkpoints name (Qwen2-VL's) and its settings in their preprocessor_config.json,
# where a checkpoint's own say nothing: each image resized to between these many pixels, each side a multiple of
# patch_size * spatial_merge_size, and normalized with this mean and std.
MIN_PIXELS, MAX_PIXELS = 65_536, 16_777_216
MEAN = STD = (0.5, 0.5, 0.5)
MAX_ASPECT_RATIO = 200
IMAGE_PAD = "<|image_pad|>"
IMAGE_TOKEN_ID = 248_056

MTP = "mtp."  # the prefix of the multi-token-prediction head's tensors (plugd.nn.mtp)


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
    heads x key dimension; each full-attention layer keys and values. Where the config announces a
    multi-token-prediction head, what it drafts from: the model's final hidden state at each position, and its
    own layers' keys and values (plugd.nn.mtp.MTPCache; counted though the checkpoint may lack the head)."""
    keys = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    values = config["linear_num_value_heads"] * config["linear_value_head_dim"]
    kernel = config.get("linear_conv_kernel_dim", 4)
    linear = LayerCache(state=(kernel - 1) * (2 * keys + values),
                        state_float32=values * config["linear_key_head_dim"])
    attention = attention_cache(config)
    layers = [linear if kind == LINEAR else attention for kind in layer_types(config)]
    if heads := config.get("mtp_num_hidden_layers", config.get("num_nextn_predict_layers", 0)):
        layers.append(LayerCache(config["hidden_size"] + heads * attention.per_position))
    return layers


@dataclass(frozen=True)
class ImageSettings:
    """How Qwen3.5's processor prepares an image for a checkpoint: its tower's patch and merge sizes (config.json),
    its pixel budget and normalization (the image processor's settings, plugd.image_processor)."""

    patch: int
    merge: int
    min_pixels: int
    max_pixels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> ImageSettings:
        """Qwen3_5VisionConfig's defaults where config.json says nothing; the budget from `size` (shortest_edge,
        longest_edge: pixel counts) or the older `min_pixels` and `max_pixels`."""
        vision, processor = config.get("vision_config") or {}, config.get(IMAGE_PROCESSOR) or {}
        size = processor.get("size") or {}
        return cls(patch=vision.get("patch_size", 16), merge=vision.get("spatial_merge_size", 2),
                   min_pixels=size.get("shortest_edge") or processor.get("min_pixels") or MIN_PIXELS,
                   max_pixels=size.get("longest_edge") or processor.get("max_pixels") or MAX_PIXELS,
                   mean=tuple(processor.get("image_mean") or MEAN), std=tuple(processor.get("image_std") or STD))

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) the processor resizes an image to: each side rounded to a multiple of patch * merge,
        then scaled (aspect ratio kept) into [min_pixels, max_pixels]; ValueError for an image more than 200 times
        wider than high, or the reverse, which the processor refuses."""
        if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
            raise ValueError(f"a {width}x{height} image is more than {MAX_ASPECT_RATIO} times wider than high, or "
                             "the reverse")
        factor = self.patch * self.merge
        new_width, new_height = round(width / factor) * factor, round(height / factor) * factor
        if new_width * new_height > self.max_pixels:
            scale = math.sqrt(width * height / self.max_pixels)
            new_width = max(factor, math.floor(width / scale / factor) * factor)
            new_height = max(factor, math.floor(height / scale / factor) * factor)
        elif new_width * new_height < self.min_pixels:
            scale = math.sqrt(self.min_pixels / (width * height))
            new_width = math.ceil(width * scale / factor) * factor
            new_height = math.ceil(height * scale / factor) * factor
        return new_width, new_height


def qwen3_5_media_tokens(config: Mapping[str, Any]) -> MediaTokens:
    """Qwen3.5's renderers write "<|vision_start|><|image_pad|><|vision_end|>" for an image; the prompt holds one
    "<|image_pad|>" per merged patch of the resized image."""
    settings = ImageSettings.of(config)

    def expansion(width: int, height: int) -> str:
        new_width, new_height = settings.resized(width, height)
        return IMAGE_PAD * ((new_width // settings.patch) * (new_height // settings.patch) // settings.merge**2)

    return MediaTokens(placeholder=IMAGE_PAD, expansion=expansion, token_id=config.get("image_token_id", IMAGE_TOKEN_ID))
