"""Anthropic image blocks: base64 sources whose bytes must be the image type they declare, as plugd Media."""

from __future__ import annotations

from typing import Any

from plugd.media import base64_image
from plugd.server.bodies import BadRequest
from plugd.types import Media

SUPPORTED = ("image/jpeg", "image/png", "image/gif", "image/webp")


def image_media(block: dict[str, Any], where: str) -> Media:
    source = block.get("source")
    if not isinstance(source, dict):
        raise BadRequest(f"{where}.source: an image block needs a source object")
    kind = source.get("type")
    if kind == "url":
        raise BadRequest(f"{where}.source: image URLs are not supported; send the image as base64")
    if kind != "base64":
        raise BadRequest(f"{where}.source: image source type {kind!r} is not supported; send the image as base64")
    media_type = source.get("media_type")
    if media_type not in SUPPORTED:
        raise BadRequest(f"{where}.source.media_type: {media_type!r} is not one of {', '.join(SUPPORTED)}")
    data = source.get("data")
    if not isinstance(data, str):
        raise BadRequest(f"{where}.source.data: must be a base64 string")
    try:
        return base64_image(data, media_type)
    except ValueError as exc:
        raise BadRequest(f"{where}.source.data: {exc}") from None
