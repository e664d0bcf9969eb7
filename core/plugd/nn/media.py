"""Media in a forward pass: images made RGB as image processors make them, and each image's embeddings written
over its span of token embeddings.

An architecture's `embed_media` gives an image's embeddings as (positions, hidden) rows, or as a (rows, columns,
hidden) grid where the language model needs the image's shape (positions of more than one axis); a grid takes
its cells' positions row by row."""

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


def media_length(embedded: mx.array) -> int:
    """The positions an image's embeddings take: its rows, or its grid's cells."""
    return embedded.size // embedded.shape[-1]


def place_media(embeddings: mx.array, media: Sequence[tuple[int, mx.array]]) -> mx.array:
    """(1, length, hidden) token embeddings with each media item's embeddings (rows or a grid) written from its
    start."""
    for start, embedded in media:
        end = start + media_length(embedded)
        if start < 0 or end > embeddings.shape[1]:
            raise ValueError(f"media span {start}..{end} lies outside the {embeddings.shape[1]} inputs")
        embeddings[:, start:end, :] = embedded.reshape(-1, embedded.shape[-1]).astype(embeddings.dtype)
    return embeddings
