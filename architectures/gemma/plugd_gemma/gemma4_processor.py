"""Gemma 4's image processor, as transformers' Gemma4ImageProcessor does it: RGB (transparency composited onto
white), a bicubic (Pillow) resize that keeps the aspect ratio within the soft-token budget
(plugd_gemma.config.gemma4_resized), rescaled to [0, 1] and cut into patches. The tower normalises the pixels
itself."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from PIL import Image

from plugd.nn.media import to_rgb
from plugd_gemma.config import gemma4_resized
from plugd_gemma.gemma3_processor import RESCALE


def preprocess(image: Image.Image, patch: int, kernel: int, budget: int) -> mx.array:
    """One image as (rows, columns, patch * patch * 3) float32 patches, each patch's pixels row by row, channels
    last."""
    rgb = to_rgb(image)
    size = gemma4_resized(*rgb.size, patch, kernel, budget)
    if size != rgb.size:
        rgb = rgb.resize(size, Image.Resampling.BICUBIC)
    pixels = np.asarray(rgb, dtype=np.float32) * np.float32(RESCALE)
    rows, columns = pixels.shape[0] // patch, pixels.shape[1] // patch
    patches = pixels.reshape(rows, patch, columns, patch, 3).transpose(0, 2, 1, 3, 4)
    return mx.array(patches.reshape(rows, columns, patch * patch * 3))
