"""Gemma 4's vision tower and its projection into the language model (Gemma4VisionModel and embed_vision).

Patches (plugd_gemma.gemma4_processor) are mapped to the tower's width
after scaling the pixels into [-1, 1], plus a learned embedding of the
patch's column and one of its row. Each encoder layer is Gemma's sandwich of
norms around bidirectional attention and a GeGLU MLP; queries and keys are
RMS-normalised with a scale, values without, scores are not scaled, and
queries and keys are rotated by the patch's position: the first half of each
head by its column, the second half by its row. The output is average-pooled
over `pooling_kernel_size`^2 patches into soft tokens, multiplied by
sqrt(hidden_size), optionally standardised, then RMS-normalised (no scale)
and projected to the text width. Its linear layers may clip their inputs and
outputs (`use_clipped_linears`); none is ever quantized.
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
from plugd.nn.norms import RMSNorm
from plugd_gemma.config import GEMMA4_VISION_DEFAULTS


@dataclass(frozen=True)
class VisionArgs:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    patch_size: int
    pooling_kernel_size: int
    position_embedding_size: int
    rope_theta: float
    use_clipped_linears: bool
    standardize: bool

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> VisionArgs:
        """Defaults where a key is absent are Gemma4VisionConfig's."""
        config = {**GEMMA4_VISION_DEFAULTS, **config}
        if config.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise ValueError(f"vision hidden_activation {config['hidden_activation']!r} is not supported")
        rope = config.get("rope_parameters") or {}
        if rope.get("rope_type", "axial") != "axial":
            raise ValueError(f"vision rope_type {rope['rope_type']!r} is not supported (only axial)")
        heads = config.get("num_attention_heads", 12)
        return cls(
            hidden_size=config.get("hidden_size", 768),
            intermediate_size=config.get("intermediate_size", 3072),
            num_hidden_layers=config.get("num_hidden_layers", 16),
            num_attention_heads=heads,
            num_key_value_heads=config.get("num_key_value_heads", heads),
            head_dim=config.get("head_dim", 64),
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            patch_size=config["patch_size"],
            pooling_kernel_size=config["pooling_kernel_size"],
            position_embedding_size=config.get("position_embedding_size", 10 * 1024),
            rope_theta=float(rope.get("rope_theta", 100.0)),
            use_clipped_linears=config.get("use_clipped_linears", False),
            standardize=config.get("standardize", False),
        )


class ClippableLinear(nn.Module):
    """A TowerLinear under `linear`, its input and output clamped to the checkpoint's bounds when it has them."""

    def __init__(self, in_dims: int, out_dims: int, clipped: bool):
        super().__init__()
        self.linear = TowerLinear(in_dims, out_dims, bias=False)
        if clipped:
            for bound, value in (("input_min", -mx.inf), ("input_max", mx.inf), ("output_min", -mx.inf),
                                 ("output_max", mx.inf)):
                setattr(self, bound, mx.array(value))
        self.clipped = clipped

    def __call__(self, x: mx.array) -> mx.array:
        if not self.clipped:
            return self.linear(x)
        y = self.linear(mx.clip(x, self["input_min"], self["input_max"]))
        return mx.clip(y, self["output_min"], self["output_max"])


def axial_rotation(positions: mx.array, head_dim: int, theta: float) -> tuple[mx.array, mx.array]:
    """cos and sin, (batch, patches, head_dim), for (batch, patches, 2) column and row positions: each half of a
    head rotated half-split by one coordinate, at the frequencies of a head_dim / 2 rotary embedding."""
    half = head_dim // 2
    inverse = 1.0 / theta ** (mx.arange(0, half, 2, dtype=mx.float32) / half)
    angles = positions.astype(mx.float32)[..., None] * inverse  # (batch, patches, 2, half / 2)
    columns, rows = angles[:, :, 0], angles[:, :, 1]
    angles = mx.concatenate([columns, columns, rows, rows], axis=-1)
    return mx.cos(angles), mx.sin(angles)


def rotate(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """(batch, patches, heads, head_dim) rotated half-split within each half of the head."""
    quarter = x.shape[-1] // 4
    parts = [x[..., i * quarter : (i + 1) * quarter] for i in range(4)]
    turned = mx.concatenate([-parts[1], parts[0], -parts[3], parts[2]], axis=-1)
    return x * cos[:, :, None] + turned * sin[:, :, None]


class Attention(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        dims, clipped = args.hidden_size, args.use_clipped_linears
        self.heads, self.kv_heads, self.head_dim = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        self.q_proj = ClippableLinear(dims, self.heads * self.head_dim, clipped)
        self.k_proj = ClippableLinear(dims, self.kv_heads * self.head_dim, clipped)
        self.v_proj = ClippableLinear(dims, self.kv_heads * self.head_dim, clipped)
        self.o_proj = ClippableLinear(self.heads * self.head_dim, dims, clipped)
        self.q_norm = RMSNorm(self.head_dim, args.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, args.rms_norm_eps)
        self.eps = args.rms_norm_eps

    def __call__(self, x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        batch, patches, _ = x.shape

        def split_heads(y: mx.array, heads: int) -> mx.array:
            return y.reshape(batch, patches, heads, self.head_dim)

        queries = rotate(self.q_norm(split_heads(self.q_proj(x), self.heads)), cos, sin)
        keys = rotate(self.k_norm(split_heads(self.k_proj(x), self.kv_heads)), cos, sin)
        values = mx.fast.rms_norm(split_heads(self.v_proj(x), self.kv_heads), None, self.eps)
        out = attend_all(*(t.transpose(0, 2, 1, 3) for t in (queries, keys, values)), 1.0)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(batch, patches, -1))


class MLP(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        dims, hidden, clipped = args.hidden_size, args.intermediate_size, args.use_clipped_linears
        self.gate_proj = ClippableLinear(dims, hidden, clipped)
        self.up_proj = ClippableLinear(dims, hidden, clipped)
        self.down_proj = ClippableLinear(hidden, dims, clipped)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(gelu_approx(self.gate_proj(x)) * self.up_proj(x))


class EncoderLayer(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        dims, eps = args.hidden_size, args.rms_norm_eps
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(dims, eps)
        self.post_attention_layernorm = RMSNorm(dims, eps)
        self.pre_feedforward_layernorm = RMSNorm(dims, eps)
        self.post_feedforward_layernorm = RMSNorm(dims, eps)

    def __call__(self, x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        h = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class Encoder(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.layers = [EncoderLayer(args) for _ in range(args.num_hidden_layers)]


class PatchEmbedder(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.input_proj = TowerLinear(3 * args.patch_size**2, args.hidden_size, bias=False)
        self.position_embedding_table = mx.zeros((2, args.position_embedding_size, args.hidden_size))

    def __call__(self, patches: mx.array, positions: mx.array) -> mx.array:
        table = self["position_embedding_table"]
        placed = table[0][positions[..., 0]] + table[1][positions[..., 1]]
        return self.input_proj(2 * (patches - 0.5)) + placed


class VisionModel(nn.Module):
    """(batch, rows, columns, patch pixels) patches -> (batch, soft tokens, hidden_size) pooled features."""

    def __init__(self, args: VisionArgs):
        super().__init__()
        self.args = args
        self.patch_embedder = PatchEmbedder(args)
        self.encoder = Encoder(args)
        if args.standardize:
            self.std_bias = mx.zeros((args.hidden_size,))
            self.std_scale = mx.ones((args.hidden_size,))

    def __call__(self, patches: mx.array) -> mx.array:
        batch, rows, columns, _ = patches.shape
        if max(rows, columns) > self.args.position_embedding_size:
            raise ValueError(f"an image of {columns}x{rows} patches exceeds the tower's position table")
        grid = mx.stack(mx.meshgrid(mx.arange(columns), mx.arange(rows), indexing="xy"), axis=-1)
        positions = mx.broadcast_to(grid.reshape(1, rows * columns, 2), (batch, rows * columns, 2))
        dtype = self.patch_embedder.input_proj.weight.dtype
        h = self.patch_embedder(patches.reshape(batch, rows * columns, -1).astype(dtype), positions)
        cos, sin = axial_rotation(positions, self.args.head_dim, self.args.rope_theta)
        cos, sin = cos.astype(h.dtype), sin.astype(h.dtype)
        for layer in self.encoder.layers:
            h = layer(h, cos, sin)
        kernel = self.args.pooling_kernel_size
        pooled = h.astype(mx.float32).reshape(batch, rows // kernel, kernel, columns // kernel, kernel, -1)
        pooled = pooled.mean(axis=(2, 4)).reshape(batch, (rows // kernel) * (columns // kernel), -1)
        pooled = pooled * self.args.hidden_size**0.5
        if self.args.standardize:
            pooled = (pooled - self["std_bias"].astype(mx.float32)) * self["std_scale"].astype(mx.float32)
        return pooled.astype(dtype)


class MultimodalEmbedder(nn.Module):
    """Soft tokens -> the language model's width: RMS-normalised without a scale, then projected."""

    def __init__(self, vision_dims: int, text_dims: int, eps: float):
        super().__init__()
        self.eps = eps
        self.embedding_projection = TowerLinear(vision_dims, text_dims, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.embedding_projection(mx.fast.rms_norm(x, None, self.eps))
