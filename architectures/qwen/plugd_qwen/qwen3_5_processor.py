"""Qwen3.5's image processor, as transformers' Qwen2-VL one does it with the checkpoint's settings
(plugd_qwen.config.ImageSettings): RGB (transparency composited onto white), a bicubic (Pillow) resize to sides
that are multiples of patch * merge within the pixel budget, rescaled to [0, 1] and normalized per channel. A
still image fills the tower's `temporal` frames with copies of itself."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from PIL import Image

from plugd.nn.media import to_rgb
from plugd_qwen.config import ImageSettings


def preprocess(image: Image.Image, settings: ImageSettings, temporal: int) -> mx.array:
    """One image as (rows, columns, 3 * temporal * patch * patch) float32 patches, in raster order, each patch
    laid out as the tower's Conv3d reads it: channel, frame, row, column."""
    rgb = to_rgb(image)
    size = settings.resized(*rgb.size)
    if size != rgb.size:
        rgb = rgb.resize(size, Image.Resampling.BICUBIC)
    mean, std = np.array(settings.mean, np.float32), np.array(settings.std, np.float32)
    pixels = (np.asarray(rgb, dtype=np.float32) / np.float32(255) - mean) / std
    patch = settings.patch
    rows, columns = size[1] // patch, size[0] // patch
    patches = pixels.reshape(rows, patch, columns, patch, 3).transpose(0, 2, 4, 1, 3)[:, :, :, None]
    frames = np.broadcast_to(patches, (rows, columns, 3, temporal, patch, patch))
    return mx.array(frames.reshape(rows, columns, -1))
