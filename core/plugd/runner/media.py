"""Images in a runner prompt: each image's run of tokens keyed by the image, and the images read from the files the
daemon named.

The daemon expands a vision prompt's placeholders (plugd.chat.tokens) and
sends each image as a span of the token ids with its digest and a file. Every
position of an image's run gets the same cache key: a negative int from the
image's sha256, so a cache policy, which compares keys, tells images apart and
never matches text against an image.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from plugd.protocol import MediaSpan


def media_key(digest: str) -> int:
    """The cache key of every position of the image whose sha256 is `digest`: negative, so no token id equals it."""
    return -int(digest[:15], 16) - 1


def media_runs(keys: Sequence[int]) -> list[tuple[int, int]]:
    """(start, end) of each maximal run of one image key."""
    runs: list[tuple[int, int]] = []
    for i, key in enumerate(keys):
        if key >= 0:
            continue
        if runs and runs[-1][1] == i and keys[i - 1] == key:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def inside_run(keys: Sequence[int], position: int) -> bool:
    """Whether a cut before `position` would split an image's run."""
    return 0 < position < len(keys) and keys[position] < 0 and keys[position - 1] == keys[position]


def keyed(tokens: Sequence[int], media: Sequence[MediaSpan]) -> tuple[list[int], dict[int, Image.Image]]:
    """The cache keys of `tokens`, each image's span holding its image's key, and the images decoded, by key;
    ValueError when a span lies outside the prompt or over another, or an image cannot be read."""
    keys, images, end = list(tokens), {}, 0
    for span in media:
        if not end <= span.start < span.end <= len(tokens):
            raise ValueError(f"an image's span [{span.start}, {span.end}) lies outside the prompt or over another")
        if len(span.digest) != 64 or any(c not in "0123456789abcdef" for c in span.digest):
            raise ValueError(f"an image's digest is not a sha256: {span.digest[:80]!r}")
        key, end = media_key(span.digest), span.end
        keys[span.start:span.end] = [key] * (span.end - span.start)
        if key not in images:
            images[key] = _decoded(span.path)
    return keys, images


def _decoded(path: str) -> Image.Image:
    try:
        image = Image.open(io.BytesIO(Path(path).read_bytes()))
        image.load()
    except (OSError, SyntaxError, ValueError) as error:
        raise ValueError(f"an image cannot be read: {error}") from None
    return image
