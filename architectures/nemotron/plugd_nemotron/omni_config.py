"""How a Nemotron-H Omni prompt holds an image, and the patch grid its processor resizes an image to; MLX-free, as
the daemon reads it too.

The processor resizes each image, aspect ratio about kept, to a grid of
16-pixel patches between 1,024 and 13,312 patches (both sides multiples of
the pixel-shuffle factor, 2); after the shuffle each 2 x 2 patches are one
image token. A prompt holds the image as "<img>", one "<image>" per token and
"</img>".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from plugd.hookspecs import IMAGE_PROCESSOR, LayerCache, MediaTokens
from plugd_nemotron.config import cache_layers

IMAGE_START, IMAGE_END, IMAGE_TOKEN = "<img>", "</img>", "<image>"
MIN_PATCHES, MAX_PATCHES = 1024, 13_312  # the processor's defaults


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's settings: `text_config`, or `llm_config` in released checkpoints' configs."""
    return config.get("text_config") or config["llm_config"]


def omni_cache_layers(config: Mapping[str, Any]) -> list[LayerCache]:
    """The language model's caches. The daemon passes `text_config` where a config has one; a released config's
    `llm_config` is found here."""
    return cache_layers(config.get("llm_config") or config)


def image_token_id(config: Mapping[str, Any]) -> int:
    """The image token: `image_token_id`, or `img_context_token_id` in released checkpoints' configs."""
    return config.get("image_token_id", config.get("img_context_token_id"))


def shuffle_factor(config: Mapping[str, Any]) -> int:
    """How many patches each side of a pixel-shuffled square holds: 1 / `downsample_ratio`."""
    return round(1 / config.get("downsample_ratio", 0.5))


def patch_grid(width: int, height: int, patch: int, merge: int, least: int = MIN_PATCHES, most: int = MAX_PATCHES
               ) -> tuple[int, int]:
    """(rows, columns) of patches the processor resizes a `width` x `height` image to: the image's own grid
    (about rounded up), scaled down to at most `most` patches or up to at least `least`, each side then moved to a
    multiple of `merge` (up where that stays within `most`, else down)."""
    # Python's round, as the processor's: half a patch more, rounded half to even.
    rows, columns = round(height / patch + 0.5), round(width / patch + 0.5)
    factor = min(math.sqrt(most / (rows * columns)), 1.0)
    rows, columns = math.floor(factor * rows), math.floor(factor * columns)
    if most > least and rows * columns < least:
        factor = math.sqrt(least / (rows * columns))
        rows, columns = math.ceil(factor * rows), math.ceil(factor * columns)
    if remainder := rows % merge:
        rows = rows + merge - remainder if (rows + merge - remainder) * columns <= most else max(merge, rows - remainder)
    if remainder := columns % merge:
        columns = (columns + merge - remainder if rows * (columns + merge - remainder) <= most
                   else max(merge, columns - remainder))
    return rows, columns


def patch_budget(config: Mapping[str, Any]) -> tuple[int, int]:
    """The fewest and most patches an image is resized to: its image processor's `min_num_patches` and
    `max_num_patches` (plugd.image_processor), else the processor's defaults."""
    processor = config.get(IMAGE_PROCESSOR) or {}
    return processor.get("min_num_patches", MIN_PATCHES), processor.get("max_num_patches", MAX_PATCHES)


def omni_media_tokens(config: Mapping[str, Any]) -> MediaTokens:
    patch, merge = (config.get("vision_config") or {}).get("patch_size", 16), shuffle_factor(config)
    least, most = patch_budget(config)

    def expansion(width: int, height: int) -> str:
        rows, columns = patch_grid(width, height, patch, merge, least, most)
        return f"{IMAGE_START}{IMAGE_TOKEN * (rows * columns // merge**2)}{IMAGE_END}"

    return MediaTokens(placeholder=IMAGE_TOKEN, expansion=expansion, token_id=image_token_id(config))
