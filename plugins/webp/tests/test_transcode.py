"""The WebP transcoder on real WebP bytes written by Pillow: lossless PNG out, other formats left alone, corrupt and
oversize images refused, and the transcoder reached through the plugin manager as the daemon reaches it."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from plugd import plugins
from plugd.types import Media
from plugd_webp.transcode import MAX_PIXELS, transcode, webp_to_png

NOTHING_ACCEPTED: frozenset[str] = frozenset()
IMAGE_TYPES = frozenset({"image/png", "image/jpeg"})


def random_image(mode: str, size=(37, 23), seed: int = 0) -> Image.Image:
    channels = len(mode)
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    return Image.fromarray(pixels, mode)


def encoded(image: Image.Image, kind: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, kind, **options)
    return out.getvalue()


def decoded(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


@pytest.mark.parametrize("mode", ["RGB", "RGBA"])
def test_lossless_webp_becomes_a_png_with_the_same_pixels(mode):
    original = random_image(mode)
    # exact: keep the colour of fully transparent pixels, which the encoder may otherwise drop
    result = transcode(Media(encoded(original, "WEBP", lossless=True, exact=True), "image/webp"), IMAGE_TYPES)
    assert result.mime_type == "image/png"
    png = decoded(result.data)
    assert png.format == "PNG" and png.mode == mode
    assert np.array_equal(np.asarray(png), np.asarray(original))


def test_an_animated_webp_gives_its_first_frame():
    # Opaque frames: the animation decoder composites each frame, so fully transparent pixels come back blank.
    frames = [random_image("RGB", seed=seed).convert("RGBA") for seed in range(3)]
    data = encoded(frames[0], "WEBP", save_all=True, append_images=frames[1:], lossless=True, duration=100)
    assert getattr(decoded(data), "n_frames", 1) == 3
    png = decoded(transcode(Media(data), NOTHING_ACCEPTED).data)
    assert np.array_equal(np.asarray(png.convert("RGBA")), np.asarray(frames[0]))


def test_webp_is_recognised_by_its_bytes_not_its_declared_type():
    data = encoded(random_image("RGB"), "WEBP", lossless=True)
    result = transcode(Media(data, "image/png"), IMAGE_TYPES)
    assert result is not None and decoded(result.data).format == "PNG"


def test_a_model_that_takes_webp_gets_it_unchanged():
    data = encoded(random_image("RGB"), "WEBP")
    assert transcode(Media(data, "image/webp"), IMAGE_TYPES | {"image/webp"}) is None


@pytest.mark.parametrize("kind, mime", [("PNG", "image/png"), ("JPEG", "image/jpeg")])
def test_other_formats_pass_through(kind, mime):
    data = encoded(random_image("RGB"), kind)
    assert transcode(Media(data, mime), NOTHING_ACCEPTED) is None
    assert transcode(Media(data, "image/webp"), NOTHING_ACCEPTED) is None  # a wrong label changes nothing


def test_corrupt_webp_is_refused():
    data = encoded(random_image("RGB", size=(64, 64)), "WEBP", lossless=True)
    truncated = data[:12] + data[12:40] + b"\x00" * 32
    with pytest.raises(ValueError, match="WebP image cannot be decoded"):
        transcode(Media(truncated), NOTHING_ACCEPTED)
    with pytest.raises(ValueError, match="WebP image cannot be decoded"):
        transcode(Media(b"RIFF\x10\x00\x00\x00WEBPgarbage!"), NOTHING_ACCEPTED)


def with_dimensions(data: bytes, width: int, height: int) -> bytes:
    """A lossless WebP whose header claims another size (14 bits each after the VP8L signature byte)."""
    patched = bytearray(data)
    start = patched.index(b"VP8L") + 8 + 1
    bits = int.from_bytes(patched[start : start + 4], "little") & ~((1 << 28) - 1)
    bits |= (width - 1) | ((height - 1) << 14)
    patched[start : start + 4] = bits.to_bytes(4, "little")
    return bytes(patched)


@pytest.mark.parametrize("width, height", [(9000, 9000), (16384, 16384)])
def test_oversize_images_are_refused_before_decoding(width, height):
    assert width * height > MAX_PIXELS
    data = with_dimensions(encoded(random_image("RGB", size=(4, 4)), "WEBP", lossless=True), width, height)
    with pytest.raises(ValueError, match="too large|pixels, more than"):
        transcode(Media(data), NOTHING_ACCEPTED)


def test_the_pixel_limit_is_a_parameter():
    data = encoded(random_image("RGB", size=(20, 10)), "WEBP", lossless=True)
    with pytest.raises(ValueError, match="20x10 pixels, more than the 199 allowed"):
        webp_to_png(data, max_pixels=199)
    assert decoded(webp_to_png(data, max_pixels=200)).size == (20, 10)


def test_registered_through_the_plugin_manager():
    transcoder = plugins.load().named("plugd_media_transcoders")["webp"]
    data = encoded(random_image("RGB"), "WEBP", lossless=True)
    assert transcoder.transcode(Media(data), NOTHING_ACCEPTED).mime_type == "image/png"
