"""Qwen3.5's vision tower and merger (Qwen3_5VisionModel): a ViT over patches whose output is merged 2 x 2 into
the language model's width.

- Patch embedding: the checkpoint's Conv3d over (frames, patch, patch) with
  its stride equal to its kernel, i.e. one linear map of each flattened patch.
- A learned square table of positions, resampled bilinearly (corners
  aligned) to each image's grid of patches, is added to the patches.
- Each block: LayerNorm, attention over all of the image's patches (one
  fused qkv projection) with 2-D rotary positions, LayerNorm, a GELU MLP.
  Rotation is half-split over the whole head at head_dim / 4 frequencies:
  the first quarter of the angles from the patch's row, the second from its
  column.
- Merger: LayerNorm per patch, the 2 x 2 patches of each block concatenated
  (row by row), linear, exact GELU, linear.

Attention sees every patch of the image and positions come with the patches, so the tower runs in raster
order; only the merger groups the blocks, as transformers' block order does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from plugd.nn.activations import gelu_approx
from plugd.nn.attention import attend_all
from plugd.nn.linear import TowerLinear
from plugd.nn.norms import LayerNorm
from plugd.nn.rope import rotate

EPS = 1e-6
ACTIVATIONS = {"gelu_pytorch_tanh": gelu_approx, "gelu": nn.gelu}


@dataclass(frozen=True)
class VisionArgs:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    spatial_merge_size: int
    temporal_patch_size: int
    out_hidden_size: int
    num_position_embeddings: int
    hidden_act: str
    rope_theta: float

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> VisionArgs:
        """Defaults where a key is absent are Qwen3_5VisionConfig's."""
        rope = config.get("rope_parameters") or {}
        if rope.get("rope_type", "axial") != "axial":
            raise ValueError(f"vision rope_type {rope['rope_type']!r} is not supported (only axial)")
        if (activation := config.get("hidden_act", "gelu_pytorch_tanh")) not in ACTIVATIONS:
            raise ValueError(f"vision hidden_act {activation!r} is not supported")
        return cls(depth=config.get("depth", 27), hidden_size=config.get("hidden_size", 1152),
                   intermediate_size=config.get("intermediate_size", 4304), num_heads=config.get("num_heads", 16),
                   in_channels=config.get("in_channels", 3), patch_size=config.get("patch_size", 16),
                   spatial_merge_size=config.get("spatial_merge_size", 2),
                   temporal_patch_size=config.get("temporal_patch_size", 2),
                   out_hidden_size=config.get("out_hidden_size", 3584),
                   num_position_embeddings=config.get("num_position_embeddings", 2304), hidden_act=activation,
                   rope_theta=float(rope.get("rope_theta", 10000.0)))

    @property
    def patch_dims(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


def corner_aligned(size: int, side: int) -> mx.array:
    """(size, side) weights that resample `side` table entries bilinearly to `size` points, end points on the
    table's first and last entries."""
    source = mx.arange(size, dtype=mx.float32) * (side - 1) / max(size - 1, 1)
    distance = mx.abs(source[:, None] - mx.arange(side, dtype=mx.float32)[None])
    return mx.maximum(1 - distance, 0)


def rotation_angles(rows: int, columns: int, head_dim: int, theta: float) -> mx.array:
    """(rows * columns, head_dim / 2) rotary angles of a raster grid of patches: row angles, then column angles."""
    quarter = head_dim // 4
    inverse = 1.0 / theta ** (mx.arange(0, 2 * quarter, 2, dtype=mx.float32) / (2 * quarter))
    row, column = (mx.arange(n, dtype=mx.float32)[:, None] * inverse for n in (rows, columns))
    grid = mx.concatenate([mx.broadcast_to(row[:, None], (rows, columns, quarter)),
                           mx.broadcast_to(column[None], (rows, columns, quarter))], axis=-1)
    return grid.reshape(rows * columns, 2 * quarter)


class PatchEmbed(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.proj = TowerLinear(args.patch_dims, args.hidden_size)

    def __call__(self, patches: mx.array) -> mx.array:
        return self.proj(patches)


class PositionTable(nn.Module):
    """The learned (side * side, hidden) positions: a plain parameter, so that quantizing leaves it dense."""

    def __init__(self, entries: int, dims: int):
        super().__init__()
        self.weight = mx.zeros((entries, dims))


class Attention(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.heads = args.num_heads
        self.scale = (args.hidden_size // self.heads) ** -0.5
        self.qkv = TowerLinear(args.hidden_size, 3 * args.hidden_size)
        self.proj = TowerLinear(args.hidden_size, args.hidden_size)

    def __call__(self, x: mx.array, angles: mx.array) -> mx.array:
        batch, length, _ = x.shape
        qkv = self.qkv(x).reshape(batch, length, 3, self.heads, -1).transpose(2, 0, 3, 1, 4)
        queries, keys, values = rotate(qkv[0], angles), rotate(qkv[1], angles), qkv[2]
        out = attend_all(queries, keys, values, self.scale)
        return self.proj(out.transpose(0, 2, 1, 3).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.linear_fc1 = TowerLinear(args.hidden_size, args.intermediate_size)
        self.linear_fc2 = TowerLinear(args.intermediate_size, args.hidden_size)
        self.activation = ACTIVATIONS[args.hidden_act]

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear_fc2(self.activation(self.linear_fc1(x)))


class Block(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.norm1 = LayerNorm(args.hidden_size, EPS)
        self.attn = Attention(args)
        self.norm2 = LayerNorm(args.hidden_size, EPS)
        self.mlp = MLP(args)

    def __call__(self, x: mx.array, angles: mx.array) -> mx.array:
        h = x + self.attn(self.norm1(x), angles)
        return h + self.mlp(self.norm2(h))


class Merger(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        merged = args.hidden_size * args.spatial_merge_size**2
        self.merge = args.spatial_merge_size
        self.norm = LayerNorm(args.hidden_size, EPS)
        self.linear_fc1 = TowerLinear(merged, merged)
        self.linear_fc2 = TowerLinear(merged, args.out_hidden_size)

    def __call__(self, x: mx.array, rows: int, columns: int) -> mx.array:
        """(batch, rows * columns, hidden) patches in raster order -> (batch, rows / m, columns / m, out)."""
        m, batch = self.merge, x.shape[0]
        blocks = self.norm(x).reshape(batch, rows // m, m, columns // m, m, -1).transpose(0, 1, 3, 2, 4, 5)
        blocks = blocks.reshape(batch, rows // m, columns // m, -1)
        return self.linear_fc2(nn.gelu(self.linear_fc1(blocks)))


class VisionModel(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.args = args
        self.side = int(args.num_position_embeddings**0.5)
        self.patch_embed = PatchEmbed(args)
        self.pos_embed = PositionTable(args.num_position_embeddings, args.hidden_size)
        self.blocks = [Block(args) for _ in range(args.depth)]
        self.merger = Merger(args)

    def __call__(self, patches: mx.array) -> mx.array:
        """(batch, rows, columns, patch dims) preprocessed images of one size -> (batch, rows / m, columns / m,
        out_hidden_size) image embeddings, a grid of merged patches."""
        batch, rows, columns, _ = patches.shape
        args = self.args
        if rows % args.spatial_merge_size or columns % args.spatial_merge_size:
            raise ValueError(f"a {rows} x {columns} grid of patches does not merge {args.spatial_merge_size} x "
                             f"{args.spatial_merge_size}")
        table = self.pos_embed["weight"].astype(mx.float32).reshape(self.side, self.side, -1)
        positions = mx.einsum("rs,stc,kt->rkc", corner_aligned(rows, self.side), table,
                              corner_aligned(columns, self.side))
        h = self.patch_embed(patches.reshape(batch, rows * columns, -1))
        h = h + positions.reshape(rows * columns, -1).astype(h.dtype)
        angles = rotation_angles(rows, columns, args.hidden_size // args.num_heads, args.rope_theta)
        for block in self.blocks:
            h = block(h, angles)
        return self.merger(h, rows, columns)
