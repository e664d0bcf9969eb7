"""Images checked and made fit for a model in the daemon: decoded whole and size-checked when they arrive, offered to
the media transcoders (plugd-webp) when the model's architecture does not take their format, refused with a message
naming the problem otherwise."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from plugd import plugins
from plugd.chat.media_prep import MediaPreparer
from plugd.chat.request import InvalidRequest
from plugd.hookspecs import Architecture, MediaTokens
from plugd.media import MAX_IMAGE_PIXELS, image
from plugd.plugins import Registry
from plugd.types import Media

VISION = Architecture("gemma3", "plugd_gemma.gemma3", media_types=frozenset({"image/png", "image/jpeg"}),
                      media_tokens=lambda config: MediaTokens("<image>", "<image>", 0))


def encoded(picture: Image.Image, kind: str, **options) -> bytes:
    out = io.BytesIO()
    picture.save(out, kind, **options)
    return out.getvalue()


def noise(size=(23, 17), mode="RGB", seed=0) -> Image.Image:
    channels = len(mode)
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    return Image.fromarray(pixels, mode)


@pytest.fixture(scope="module")
def registry() -> Registry:
    return plugins.load()


def test_formats_the_model_takes_pass_untouched(registry):
    preparer = MediaPreparer(registry, "g", VISION)
    items = [image(encoded(noise(), "PNG")), image(encoded(noise(), "JPEG"))]
    assert preparer.prepare(items) == items


@pytest.mark.parametrize("mode", ["RGB", "RGBA"])
def test_webp_becomes_a_lossless_png(registry, mode):
    picture = noise(mode=mode)
    webp = image(encoded(picture, "WEBP", lossless=True, exact=True))  # exact: keep RGB under transparent pixels
    assert webp.mime_type == "image/webp"
    [png] = MediaPreparer(registry, "g", VISION).prepare([webp])
    assert png.mime_type == "image/png"
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png.data))), np.asarray(picture))


def test_an_animated_webp_gives_its_first_frame(registry):
    frames = [noise(seed=1), noise(seed=2)]
    animated = encoded(frames[0], "WEBP", lossless=True, save_all=True, append_images=frames[1:])
    [png] = MediaPreparer(registry, "g", VISION).prepare([image(animated)])
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png.data))), np.asarray(frames[0]))


def test_without_a_transcoder_webp_is_refused_naming_what_the_model_takes():
    webp = image(encoded(noise(), "WEBP"))
    with pytest.raises(InvalidRequest) as refused:
        MediaPreparer(Registry([], {}), "g", VISION).prepare([webp])
    message = str(refused.value)
    assert "image/webp" in message and "image/jpeg, image/png" in message and "plugd-webp" in message


@pytest.mark.parametrize("architecture", [None, Architecture("qwen3", "plugd_qwen.qwen3")])
def test_a_model_without_vision_refuses_images(registry, architecture):
    with pytest.raises(InvalidRequest, match="model 'q' does not support images"):
        MediaPreparer(registry, "q", architecture).prepare([image(encoded(noise(), "PNG"))])
    assert MediaPreparer(registry, "q", architecture).prepare([]) == []


def test_an_oversize_webp_is_refused_by_the_transcoder(registry):
    # Decoding checks the size from the header first, so the oversize image is never decoded.
    huge = Media(encoded(Image.new("L", (8200, 8200)), "WEBP", lossless=True, method=0), "image/webp")
    with pytest.raises(InvalidRequest, match="invalid image: .*8200x8200"):
        MediaPreparer(registry, "g", VISION).prepare([huge])


def test_an_oversize_image_is_refused_when_it_arrives():
    side = int(MAX_IMAGE_PIXELS**0.5) + 1
    with pytest.raises(ValueError, match=f"{side}x{side} pixels, more than the {MAX_IMAGE_PIXELS}"):
        image(encoded(Image.new("1", (side, side)), "PNG"))


@pytest.mark.parametrize(("data", "error"), [
    (encoded(noise(), "PNG")[:-40], "cannot be decoded"),
    (encoded(noise(), "JPEG")[:200], "cannot be decoded"),
    (b"plain text", "not an image"),
])
def test_undecodable_bytes_are_refused_when_they_arrive(data, error):
    with pytest.raises(ValueError, match=error):
        image(data)
