"""NVIDIA's RADIO vision tower (transformers' RadioModel), as Nemotron-H Omni runs it on one image at a time.

Patches (channel-major, plugd_nemotron.omni_processor) are projected to the
tower's width and given a position embedding cropped from the learned square
table: the table resized bilinearly to the longer side of the image's patch
grid, then cut to the grid. Learned class and register tokens go in front;
pre-norm ViT layers (LayerNorm, full bidirectional attention, a GELU MLP or a
SwiGLU feed-forward, each branch scaled by a learned per-channel factor)
follow. The patch positions of the last layer are the image's features.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from plugd.nn.activations import silu
from plugd.nn.attention import attend_all
from plugd.nn.linear import TowerLinear
from plugd.nn.norms import LayerNorm


@dataclass(frozen=True)
class RadioArgs:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    mlp_ratio: float
    layer_norm_eps: float
    use_swiglu_ffn: bool
    qkv_bias: bool
    patch_size: int
    patch_dim: int
    max_img_size: int
    prefix_tokens: int  # class and register tokens

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> RadioArgs:
        """Defaults where a key is absent are RadioConfig's."""
        if config.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"RADIO hidden_act {config['hidden_act']!r} is not supported")
        patch, channels = config.get("patch_size", 16), config.get("num_channels", 3)
        return cls(
            hidden_size=config.get("hidden_size", 1280),
            num_hidden_layers=config.get("num_hidden_layers", 32),
            num_attention_heads=config.get("num_attention_heads", 16),
            mlp_ratio=config.get("mlp_ratio", 4.0),
            layer_norm_eps=config.get("layer_norm_eps", 1e-6),
            use_swiglu_ffn=config.get("use_swiglu_ffn", False),
            qkv_bias=config.get("qkv_bias", True),
            patch_size=patch,
            patch_dim=config.get("patch_dim") or channels * patch * patch,
            max_img_size=config.get("max_img_size", 2048),
            prefix_tokens=config.get("num_cls_tokens", 3) + config.get("num_registers", 7),
        )

    @property
    def table_side(self) -> int:
        return self.max_img_size // self.patch_size


def bilinear_weights(source: int, target: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each of `target` positions resampled from `source` (half-pixel centres, edges clamped), the two source
    indices it reads and the weight of the second."""
    centres = np.maximum((np.arange(target, dtype=np.float32) + 0.5) * np.float32(source / target) - 0.5, 0)
    first = np.floor(centres).astype(np.int32)
    second = np.minimum(first + 1, source - 1)
    return first, second, (centres - first).astype(np.float32)


def resampled(table: mx.array, side: int) -> mx.array:
    """A (rows, columns, dims) table resized bilinearly to (side, side)."""
    rows_a, rows_b, row_weight = bilinear_weights(table.shape[0], side)
    columns_a, columns_b, column_weight = bilinear_weights(table.shape[1], side)
    row_weight, column_weight = mx.array(row_weight)[:, None, None], mx.array(column_weight)[None, :, None]
    rows = table[mx.array(rows_a)] * (1 - row_weight) + table[mx.array(rows_b)] * row_weight
    return rows[:, mx.array(columns_a)] * (1 - column_weight) + rows[:, mx.array(columns_b)] * column_weight


class PatchEmbeddings(nn.Module):
    def __init__(self, args: RadioArgs):
        super().__init__()
        self.side = args.table_side
        self.patch_projection = TowerLinear(args.patch_dim, args.hidden_size, bias=False)
        self.position_embedding = mx.zeros((1, self.side * self.side, args.hidden_size))
        self.cls_register_token = mx.zeros((args.prefix_tokens, args.hidden_size))

    def __call__(self, patches: mx.array) -> mx.array:
        """(batch, rows, columns, patch_dim) -> (batch, prefix + rows * columns, hidden)."""
        batch, rows, columns, _ = patches.shape
        table = self["position_embedding"].astype(mx.float32).reshape(self.side, self.side, -1)
        positions = resampled(table, max(rows, columns))[:rows, :columns].reshape(rows * columns, -1)
        h = self.patch_projection(patches.reshape(batch, rows * columns, -1))
        h = h + positions.astype(h.dtype)
        prefix = mx.broadcast_to(self["cls_register_token"], (batch, *self["cls_register_token"].shape))
        return mx.concatenate([prefix.astype(h.dtype), h], axis=1)


class Attention(nn.Module):
    def __init__(self, args: RadioArgs):
        super().__init__()
        dims = args.hidden_size
        self.heads = args.num_attention_heads
        self.scale = (dims // self.heads) ** -0.5
        self.q_proj = TowerLinear(dims, dims, args.qkv_bias)
        self.k_proj = TowerLinear(dims, dims, args.qkv_bias)
        self.v_proj = TowerLinear(dims, dims, args.qkv_bias)
        self.o_proj = TowerLinear(dims, dims)

    def __call__(self, x: mx.array) -> mx.array:
        batch, length, _ = x.shape

        def heads_first(y: mx.array) -> mx.array:
            return y.reshape(batch, length, self.heads, -1).transpose(0, 2, 1, 3)

        out = attend_all(heads_first(self.q_proj(x)), heads_first(self.k_proj(x)), heads_first(self.v_proj(x)),
                         self.scale)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, args: RadioArgs):
        super().__init__()
        hidden = int(args.hidden_size * args.mlp_ratio)
        self.fc1 = TowerLinear(args.hidden_size, hidden)
        self.fc2 = TowerLinear(hidden, args.hidden_size)

    def __call__(self, x: mx.array) -> mx.array:
        return self.fc2(nn.gelu(self.fc1(x)))


class SwiGLU(nn.Module):
    def __init__(self, args: RadioArgs):
        super().__init__()
        hidden = (int(int(args.hidden_size * args.mlp_ratio) * 2 / 3) + 7) // 8 * 8
        self.gate_proj = TowerLinear(args.hidden_size, hidden)
        self.up_proj = TowerLinear(args.hidden_size, hidden)
        self.down_proj = TowerLinear(hidden, args.hidden_size)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(silu(self.gate_proj(x)) * self.up_proj(x))


class LayerScale(nn.Module):
    def __init__(self, dims: int):
        super().__init__()
        self.lambda1 = mx.ones((dims,))

    def __call__(self, x: mx.array) -> mx.array:
        return x * self["lambda1"]


class Layer(nn.Module):
    def __init__(self, args: RadioArgs):
        super().__init__()
        dims, eps = args.hidden_size, args.layer_norm_eps
        self.norm1 = LayerNorm(dims, eps)
        self.attention = Attention(args)
        self.layer_scale1 = LayerScale(dims)
        self.norm2 = LayerNorm(dims, eps)
        self.mlp = SwiGLU(args) if args.use_swiglu_ffn else MLP(args)
        self.layer_scale2 = LayerScale(dims)

    def __call__(self, x: mx.array) -> mx.array:
        h = x + self.layer_scale1(self.attention(self.norm1(x)))
        return h + self.layer_scale2(self.mlp(self.norm2(h)))


class Encoder(nn.Module):
    def __init__(self, args: RadioArgs):
        super().__init__()
        self.layer = [Layer(args) for _ in range(args.num_hidden_layers)]


class RadioModel(nn.Module):
    """(batch, rows, columns, patch_dim) normalised patches -> (batch, rows * columns, hidden) features."""

    def __init__(self, args: RadioArgs):
        super().__init__()
        self.args = args
        self.embeddings = PatchEmbeddings(args)
        self.encoder = Encoder(args)

    def __call__(self, patches: mx.array) -> mx.array:
        h = self.embeddings(patches.astype(self.embeddings.patch_projection.weight.dtype))
        for layer in self.encoder.layer:
            h = layer(h)
        return h[:, self.args.prefix_tokens :]
