"""The SigLIP vision encoder Gemma 3 uses as its image tower (config `vision_config`, model_type siglip_vision_model).

Images arrive channels-last, (batch, height, width, channels). Non-overlapping
patches are embedded by a strided convolution, a learned position embedding is
added per patch, and pre-norm transformer blocks (LayerNorm, full
bidirectional attention, GELU MLP, biases everywhere) run over the patch
sequence; a final LayerNorm closes it. Gemma 3 uses no pooling head.

The tower's layers have no `to_quantized`, so quantizing a checkpoint leaves
them dense, as mlx-vlm does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from plugd.nn.attention import scaled_dot_product_attention
from plugd.nn.linear import TowerLinear
from plugd.nn.norms import LayerNorm


@dataclass(frozen=True)
class VisionArgs:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    num_channels: int
    layer_norm_eps: float

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> VisionArgs:
        if config.get("vision_use_head"):
            raise ValueError("a SigLIP pooling head (vision_use_head) is not supported; Gemma 3 has none")
        activation = config.get("hidden_act", "gelu_pytorch_tanh")
        if activation != "gelu_pytorch_tanh":
            raise ValueError(f"vision hidden_act {activation!r} is not supported, only 'gelu_pytorch_tanh'")
        return cls(
            hidden_size=config.get("hidden_size", 1152),
            intermediate_size=config.get("intermediate_size", 4304),
            num_hidden_layers=config.get("num_hidden_layers", 27),
            num_attention_heads=config.get("num_attention_heads", 16),
            image_size=config.get("image_size", 896),
            patch_size=config.get("patch_size", 14),
            num_channels=config.get("num_channels", 3),
            layer_norm_eps=config.get("layer_norm_eps", 1e-6),
        )

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size


class Attention(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        dims = args.hidden_size
        self.heads = args.num_attention_heads
        self.scale = (dims // self.heads) ** -0.5
        self.q_proj = TowerLinear(dims, dims)
        self.k_proj = TowerLinear(dims, dims)
        self.v_proj = TowerLinear(dims, dims)
        self.out_proj = TowerLinear(dims, dims)

    def __call__(self, x: mx.array) -> mx.array:
        batch, length, _ = x.shape

        def heads_first(y: mx.array) -> mx.array:
            return y.reshape(batch, length, self.heads, -1).transpose(0, 2, 1, 3)

        queries, keys, values = heads_first(self.q_proj(x)), heads_first(self.k_proj(x)), heads_first(self.v_proj(x))
        out = scaled_dot_product_attention(queries, keys, values, self.scale)
        return self.out_proj(out.transpose(0, 2, 1, 3).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.fc1 = TowerLinear(args.hidden_size, args.intermediate_size)
        self.fc2 = TowerLinear(args.intermediate_size, args.hidden_size)

    def __call__(self, x: mx.array) -> mx.array:
        return self.fc2(nn.gelu_approx(self.fc1(x)))


class EncoderLayer(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.layer_norm1 = LayerNorm(args.hidden_size, args.layer_norm_eps)
        self.self_attn = Attention(args)
        self.layer_norm2 = LayerNorm(args.hidden_size, args.layer_norm_eps)
        self.mlp = MLP(args)

    def __call__(self, x: mx.array) -> mx.array:
        h = x + self.self_attn(self.layer_norm1(x))
        return h + self.mlp(self.layer_norm2(h))


class Encoder(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.layers = [EncoderLayer(args) for _ in range(args.num_hidden_layers)]

    def __call__(self, x: mx.array) -> mx.array:
        for layer in self.layers:
            x = layer(x)
        return x


class PatchEmbedding(nn.Module):
    """A convolution with kernel and stride `patch_size`; its weight is kept (out, kh, kw, in) as MLX convolves."""

    def __init__(self, args: VisionArgs):
        super().__init__()
        self.patch_size = args.patch_size
        self.weight = mx.zeros((args.hidden_size, args.patch_size, args.patch_size, args.num_channels))
        self.bias = mx.zeros((args.hidden_size,))

    def __call__(self, pixels: mx.array) -> mx.array:
        patches = mx.conv2d(pixels, self["weight"], stride=self.patch_size) + self["bias"]
        return patches.reshape(patches.shape[0], -1, patches.shape[-1])


class Embeddings(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.patch_embedding = PatchEmbedding(args)
        self.position_embedding = nn.Module()
        self.position_embedding.weight = mx.zeros((args.patches_per_side**2, args.hidden_size))

    def __call__(self, pixels: mx.array) -> mx.array:
        return self.patch_embedding(pixels) + self.position_embedding["weight"]


class VisionModel(nn.Module):
    """The checkpoint's `vision_tower.vision_model.` subtree: (batch, H, W, C) pixels -> (batch, patches, hidden)."""

    def __init__(self, args: VisionArgs):
        super().__init__()
        self.embeddings = Embeddings(args)
        self.encoder = Encoder(args)
        self.post_layernorm = LayerNorm(args.hidden_size, args.layer_norm_eps)

    def __call__(self, pixels: mx.array) -> mx.array:
        return self.post_layernorm(self.encoder(self.embeddings(pixels)))


def patch_weight_channels_last(weight: mx.array, channels: int) -> mx.array:
    """The patch convolution's weight as MLX takes it: checkpoints from transformers hold it (out, in, kh, kw),
    converted ones (mlx-vlm) already (out, kh, kw, in)."""
    if weight.shape[1] == channels and weight.shape[-1] != channels:
        return weight.transpose(0, 2, 3, 1)
    return weight
