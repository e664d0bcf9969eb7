"""Which Gemma layers slide, what each layer caches for the daemon's memory estimate, and how a Gemma 3 or Gemma 4
prompt holds an image; MLX-free, as the daemon reads it too.

Older configs give the layer pattern as `sliding_window_pattern` (every n-th layer global); transformers 5 lists
`layer_types`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from plugd.hookspecs import IMAGE_PROCESSOR, LayerCache, MediaTokens, attention_cache

SLIDING = "sliding_attention"
FULL = "full_attention"
IMAGE_START, IMAGE_END, IMAGE_TOKEN = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
GEMMA4_IMAGE_START, GEMMA4_IMAGE_END, GEMMA4_IMAGE_TOKEN = "<|image>", "<image|>", "<|image|>"
# Gemma 4's image processor: 16-pixel patches, pooled 3 x 3 into one soft token each, 280 soft tokens at most.
GEMMA4_VISION_DEFAULTS = {"patch_size": 16, "pooling_kernel_size": 3}
GEMMA4_SOFT_TOKENS = 280


def layer_types(config: Mapping[str, Any], default_pattern: int) -> list[str]:
    """Each layer's attention kind, from `layer_types` or else `sliding_window_pattern` (every n-th layer full)."""
    count = config["num_hidden_layers"]
    if config.get("layer_types"):
        kinds = list(config["layer_types"])
        if len(kinds) != count or set(kinds) - {SLIDING, FULL}:
            raise ValueError(f"layer_types must name {count} layers as {SLIDING!r} or {FULL!r}")
        return kinds
    pattern = config.get("sliding_window_pattern") or default_pattern
    return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(count)]


def gemma3_cache_layers(config: Mapping[str, Any]) -> list[LayerCache]:
    """Keys and values of every position on global layers, of the last `sliding_window` on sliding ones."""
    return [attention_cache(config, config["sliding_window"] if kind == SLIDING else None)
            for kind in layer_types(config, default_pattern=6)]


def gemma4_global_heads(config: Mapping[str, Any]) -> tuple[int, int | None]:
    """The head size of Gemma 4's global layers and their key/value head count where keys double as values:
    `global_head_dim` and `num_global_key_value_heads` in the hub's configs, the global layers' entries of
    `per_layer_config` in those transformers 5 writes."""
    kinds = config.get("layer_types") or []
    per_layer = config.get("per_layer_config") or {}
    overrides = next((per_layer[key] for key in (str(i) for i, kind in enumerate(kinds) if kind == FULL)
                      if key in per_layer), {})
    head_dim = config.get("global_head_dim") or overrides.get("head_dim") or 512
    return head_dim, config.get("num_global_key_value_heads") or overrides.get("num_key_value_heads")


def gemma4_cache_layers(config: Mapping[str, Any]) -> list[LayerCache]:
    """As Gemma 3's, with global layers of wider heads (`global_head_dim`) and their own key/value head count
    (`num_global_key_value_heads`, where keys double as values), and nothing for the last
    `num_kv_shared_layers` layers, which reuse earlier layers' keys and values."""
    kinds = layer_types(config, default_pattern=5)
    heads = config.get("num_key_value_heads") or config.get("num_attention_heads", 1)
    global_head_dim, global_kv_heads = gemma4_global_heads(config)
    wide = {"head_dim": max(config["head_dim"], global_head_dim), "num_key_value_heads": max(heads, global_kv_heads or 0)}
    caches = [attention_cache(config, config["sliding_window"]) if kind == SLIDING
              else attention_cache(config | wide) for kind in kinds]
    shared = min(config.get("num_kv_shared_layers", 20), len(kinds))
    return caches[: len(kinds) - shared] + [LayerCache()] * shared


def gemma3_media_tokens(config: Mapping[str, Any]) -> MediaTokens:
    """Gemma 3's renderer writes "<start_of_image>" for an image; the prompt holds it as that token between blank
    lines, `mm_tokens_per_image` image tokens, and "<end_of_image>"."""
    count = config.get("mm_tokens_per_image", 256)
    return MediaTokens(placeholder=IMAGE_START, expansion=f"\n\n{IMAGE_START}{IMAGE_TOKEN * count}{IMAGE_END}\n\n",
                       token_id=config.get("image_token_index", 262_144))


def gemma4_vision_settings(config: Mapping[str, Any]) -> tuple[int, int, int]:
    """(patch size, pooling kernel, soft-token budget per image) of a Gemma 4 checkpoint: the budget is its image
    processor's `max_soft_tokens` (plugd.image_processor), else config.json's `vision_soft_tokens_per_image`."""
    vision = {**GEMMA4_VISION_DEFAULTS, **(config.get("vision_config") or {})}
    budget = (config.get(IMAGE_PROCESSOR) or {}).get("max_soft_tokens") or config.get(
        "vision_soft_tokens_per_image", GEMMA4_SOFT_TOKENS)
    return vision["patch_size"], vision["pooling_kernel_size"], budget


def gemma4_resized(width: int, height: int, patch: int, kernel: int, budget: int) -> tuple[int, int]:
    """(width, height) Gemma 4's processor resizes an image to: the aspect ratio kept, as large as `budget` soft
    tokens allow, each side a multiple of `kernel` patches (at least one, at most `budget` of them for an image
    far wider than high, or the reverse)."""
    side = kernel * patch
    factor = math.sqrt(budget * kernel**2 * patch**2 / (height * width))
    new_height = math.floor(factor * height / side) * side
    new_width = math.floor(factor * width / side) * side
    if new_height == 0 and new_width == 0:
        raise ValueError(f"a {width}x{height} image cannot be resized for the vision tower")
    if new_height == 0:
        new_height, new_width = side, min(width // height * side, budget * side)
    elif new_width == 0:
        new_width, new_height = side, min(height // width * side, budget * side)
    return new_width, new_height


def gemma4_media_tokens(config: Mapping[str, Any]) -> MediaTokens:
    """Gemma 4's renderer writes "<|image|>" for an image; the prompt holds it as "<|image>", one "<|image|>" per
    soft token of the resized image, and "<image|>"."""
    patch, kernel, budget = gemma4_vision_settings(config)

    def expansion(width: int, height: int) -> str:
        new_width, new_height = gemma4_resized(width, height, patch, kernel, budget)
        count = (new_width // patch) * (new_height // patch) // kernel**2
        return f"{GEMMA4_IMAGE_START}{GEMMA4_IMAGE_TOKEN * count}{GEMMA4_IMAGE_END}"

    return MediaTokens(placeholder=GEMMA4_IMAGE_TOKEN, expansion=expansion, token_id=config.get("image_token_id", 258_880))
