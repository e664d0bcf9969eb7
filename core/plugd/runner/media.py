"""Images in a runner prompt: placeholders expanded, each image's run of tokens found, its positions keyed by the image.

A vision model (see the media contract in docs/plugins.md) names the text a
renderer writes for an image (`media_placeholder`), the text that replaces it
before tokenization (`media_expansion`) and the token whose positions take the
image's embeddings (`media_token_id`). Every position of an image's run gets
the same cache key: a negative int from the sha256 of the image's bytes, so a
cache policy, which compares keys, tells images apart and never matches text
against an image.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from collections.abc import Sequence
from typing import Any

import attrs
from PIL import Image

from plugd.protocol import MediaItem
from plugd.tokenizer import Tokenizer


@attrs.define
class EncodedPrompt:
    tokens: list[int]
    keys: list[int]  # the tokens, but each position of an image run holds its image's key
    images: dict[int, Image.Image]  # by key


def media_key(data: bytes) -> int:
    """The cache key of every position of an image: negative, so that no token id equals it."""
    return -int(hashlib.sha256(data).hexdigest()[:15], 16) - 1


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


def encode(model: Any, tokenizer: Tokenizer, text: str, media: Sequence[MediaItem] = (),
           decode_images: bool = True) -> EncodedPrompt:
    """`text` tokenized with each image placeholder expanded; `media` are the images in order, as the runner
    protocol carries them. ValueError when they do not fit the prompt. Without
    `decode_images` the images are left out (`images` empty), for counting tokens."""
    placeholder = getattr(model, "media_placeholder", None)
    if placeholder is None:
        if media:
            raise ValueError("this model does not take images")
        tokens = tokenizer.encode(text)
        return EncodedPrompt(tokens, tokens, {})
    pieces = text.split(placeholder)
    if len(pieces) - 1 != len(media):
        raise ValueError(f"the prompt has {len(pieces) - 1} image placeholders ({placeholder}) "
                         f"but the request carries {len(media)} images")
    tokens = tokenizer.encode(model.media_expansion.join(pieces))
    keys = list(tokens)
    runs = [(start, end) for start, end in _token_runs(tokens, model.media_token_id)]
    if len(runs) != len(media):
        raise ValueError(f"the prompt holds {len(runs)} runs of image tokens for {len(media)} images: "
                         "image tokens written as text are not allowed")
    images: dict[int, Image.Image] = {}
    for (start, end), item in zip(runs, media, strict=True):
        data = _bytes(item.data)
        key = media_key(data)
        keys[start:end] = [key] * (end - start)
        if decode_images and key not in images:
            images[key] = _decoded(data)
    return EncodedPrompt(tokens, keys, images)


def _token_runs(tokens: Sequence[int], token_id: int) -> list[tuple[int, int]]:
    return media_runs([-1 if t == token_id else 0 for t in tokens])


def _bytes(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("an image is not valid base64") from None


def _decoded(data: bytes) -> Image.Image:
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (OSError, SyntaxError, ValueError) as error:
        raise ValueError(f"an image cannot be decoded: {error}") from None
    return image
