"""Images from clients: base64 and data: URLs decoded, and the bytes checked to really be an image."""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings

from PIL import Image, UnidentifiedImageError

from plugd.types import Media

_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,(?P<data>.*)", re.DOTALL)


# 64 megapixels: more than any vision model takes whole, far less than what would exhaust memory to decode.
MAX_IMAGE_PIXELS = 8192 * 8192


def image(data: bytes, declared_mime: str | None = None) -> Media:
    """The image in `data`, its type read from the bytes; ValueError when they are not an image of a known format,
    do not decode, or hold more than MAX_IMAGE_PIXELS pixels.

    A declared type that contradicts the bytes is refused too: a client that
    labels a JPEG as PNG has mixed up its attachments.
    """
    kind = checked_format(data)
    mime = Image.MIME.get(kind, f"image/{kind.lower()}")
    if declared_mime and declared_mime.lower() != mime:
        raise ValueError(f"the image is declared as {declared_mime} but its bytes are {mime}")
    return Media(data, mime)


def checked_format(data: bytes) -> str:
    """The Pillow format name of the image in `data`, after decoding it whole (its size checked first)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as opened:
                width, height = opened.size
                if width * height <= MAX_IMAGE_PIXELS:
                    opened.load()
                kind = opened.format or "unknown"
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as bomb:
        raise ValueError(f"the image is too large: {bomb}") from None
    except UnidentifiedImageError:
        raise ValueError("the image data is not an image in a format plugd reads (PNG, JPEG, GIF, WebP, BMP...)") from None
    except (OSError, SyntaxError, ValueError) as error:
        raise ValueError(f"the image data cannot be decoded: {error}") from None
    if width * height > MAX_IMAGE_PIXELS:
        raise ValueError(f"the image is {width}x{height} pixels, more than the {MAX_IMAGE_PIXELS} plugd accepts")
    return kind


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) of an image that `image` has checked, read from its header."""
    with Image.open(io.BytesIO(data)) as opened:
        return opened.size


def base64_image(text: str, declared_mime: str | None = None) -> Media:
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the image is not valid base64") from None
    return image(data, declared_mime)


def data_url_image(url: str) -> Media:
    """An image given as a `data:<mime>;base64,...` URL; other URLs are refused (plugd fetches nothing)."""
    match = _DATA_URL.fullmatch(url.strip())
    if match is None:
        raise ValueError("only base64 data: URLs are supported for images; plugd does not fetch remote URLs")
    return base64_image(match["data"], match["mime"])
