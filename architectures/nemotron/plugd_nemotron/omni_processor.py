"""Nemotron-H Omni's image processor, as transformers' processor does it: RGB (transparency composited onto white),
a bicubic resize to the patch grid plugd_nemotron.omni_config.patch_grid picks, done in float so that the kernel's
overshoot is kept, rescaled to [0, 1], normalized with CLIP's mean and std and cut into channel-major patches.

The resize is Pillow's antialiased bicubic on float images; transformers
runs torchvision's, whose antialiased kernel is the same, on float32
tensors (they differ by about 1e-3 of the 0-255 range, 4e-6 after
normalisation).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from PIL import Image

from plugd.nn.media import to_rgb
from plugd_nemotron.omni_config import patch_grid

CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)


def preprocess(image: Image.Image, patch: int, merge: int, budget: tuple[int, int]) -> mx.array:
    """One image as (rows, columns, 3 * patch * patch) float32 patches, each patch's channels one after another;
    `budget`: the fewest and most patches (plugd_nemotron.omni_config.patch_budget)."""
    rgb = to_rgb(image)
    rows, columns = patch_grid(*rgb.size, patch, merge, *budget)
    size = (columns * patch, rows * patch)
    pixels = np.asarray(rgb, dtype=np.float32)
    if rgb.size != size:
        channels = [Image.fromarray(np.ascontiguousarray(pixels[..., c]), "F").resize(size, Image.Resampling.BICUBIC)
                    for c in range(3)]
        pixels = np.stack([np.asarray(channel) for channel in channels], axis=-1)
    pixels = (pixels / np.float32(255) - CLIP_MEAN) / CLIP_STD
    patches = pixels.reshape(rows, patch, columns, patch, 3).transpose(0, 2, 4, 1, 3)
    return mx.array(patches.reshape(rows, columns, 3 * patch * patch))
