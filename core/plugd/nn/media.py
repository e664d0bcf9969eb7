"""Media in a forward pass: images made RGB as image processors make them, and each image's embeddings written
over its span of token embeddings."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
from PIL import Image


def to_rgb(image: Image.Image) -> Image.Image:
    """`image` in RGB, any transparency composited onto white (as transformers' image processors convert)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, image).convert("RGB")
    return image.convert("RGB")


def place_media(embeddings: mx.array, media: Sequence[tuple[int, mx.array]]) -> mx.array:
    """(1, length, hidden) token embeddings with each media item's (n, hidden) rows written at its start."""
    for start, rows in media:
        if start < 0 or start + rows.shape[0] > embeddings.shape[1]:
            raise ValueError(f"media span {start}..{start + rows.shape[0]} lies outside the {embeddings.shape[1]} inputs")
        embeddings[:, start : start + rows.shape[0], :] = rows.astype(embeddings.dtype)
    return embeddings
