"""Which Gemma layers slide, what each layer caches for the daemon's memory estimate, and how a Gemma 3 prompt holds
an image; MLX-free, as the daemon reads it too.

Older configs give the layer pattern as `sliding_window_pattern` (every n-th layer global); transformers 5 lists
`layer_types`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plugd.hookspecs import LayerCache, MediaTokens, attention_cache

SLIDING = "sliding_attention"
FULL = "full_attention"
IMAGE_START, IMAGE_END, IMAGE_TOKEN = "<start_of_image>", "<end_of_image>", "<image_soft_token>"


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


def gemma4_cache_layers(config: Mapping[str, Any]) -> list[LayerCache]:
    """As Gemma 3's, with global layers of wider heads (`global_head_dim`) and their own key/value head count
    (`num_global_key_value_heads`, where keys double as values), and nothing for the last
    `num_kv_shared_layers` layers, which reuse earlier layers' keys and values."""
    kinds = layer_types(config, default_pattern=5)
    heads = config.get("num_key_value_heads") or config.get("num_attention_heads", 1)
    wide = {"head_dim": max(config["head_dim"], config.get("global_head_dim") or 512),
            "num_key_value_heads": max(heads, config.get("num_global_key_value_heads") or 0)}
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
