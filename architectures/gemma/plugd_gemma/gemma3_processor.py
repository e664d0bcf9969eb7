"""Gemma 3's image processor, as transformers' Gemma3ImageProcessor does it without pan-and-scan: transparency
composited onto white, RGB, a bilinear (Pillow) resize to the tower's square input, rescaled to [0, 1] and
normalized with mean and std 0.5 per channel, i.e. into [-1, 1]."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from PIL import Image

from plugd.nn.media import to_rgb

MEAN = 0.5
STD = 0.5
RESCALE = 1 / 255


def preprocess(image: Image.Image, size: int) -> mx.array:
    """One image as (size, size, 3) float32 pixel values, channels last."""
    resized = to_rgb(image).resize((size, size), Image.Resampling.BILINEAR)
    pixels = np.asarray(resized, dtype=np.float32) * np.float32(RESCALE)
    return mx.array((pixels - np.float32(MEAN)) / np.float32(STD))
