"""WebP -> PNG, losslessly, for models that cannot take WebP.

WebP is recognised by its bytes (a RIFF container of form type "WEBP"),
never by a name or a declared type. An animated WebP gives its first frame.
"""

from __future__ import annotations

import io
import warnings

from PIL import Image

from plugd.types import Media

WEBP = "image/webp"
PNG = "image/png"
# 64 megapixels: well above any image a vision model takes whole, well below what would exhaust memory to decode.
MAX_PIXELS = 8192 * 8192


def is_webp(data: bytes) -> bool:
    return len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP"


def transcode(media: Media, accepted_mime_types: frozenset[str]) -> Media | None:
    """`media` as PNG when its bytes are WebP and the model does not accept WebP; None when there is nothing to do."""
    if not is_webp(media.data) or WEBP in accepted_mime_types:
        return None
    return Media(webp_to_png(media.data), PNG)


def webp_to_png(data: bytes, max_pixels: int = MAX_PIXELS) -> bytes:
    """The first frame of the WebP image in `data`, encoded as PNG with the same pixels and mode (RGB or RGBA).

    Raises ValueError when the bytes do not decode as WebP, or when the image has more than `max_pixels` pixels
    (checked from the header, before anything is decoded).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data), formats=["WEBP"])
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as bomb:
        raise ValueError(f"the WebP image is too large to convert: {bomb}") from None
    except (OSError, SyntaxError, ValueError) as error:
        raise ValueError(f"the WebP image cannot be decoded: {error}") from None
    with opened:
        width, height = opened.size
        if width * height > max_pixels:
            raise ValueError(f"the WebP image is {width}x{height} pixels, more than the {max_pixels} allowed")
        try:
            opened.seek(0)
            opened.load()
        except (OSError, SyntaxError, ValueError) as error:
            raise ValueError(f"the WebP image cannot be decoded: {error}") from None
        out = io.BytesIO()
        opened.save(out, "PNG")
    return out.getvalue()
