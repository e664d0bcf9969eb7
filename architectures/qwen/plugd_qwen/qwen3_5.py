"""Qwen3.5, config.json model_type "qwen3_5": Qwen3-Next's hybrid decoder (plugd_qwen.qwen3_next) with the
linear attention's projections kept apart (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`) and a
SwiGLU MLP on every layer; its MoE twin (plugd_qwen.qwen3_5_moe) has routed plus shared experts on every layer.

Hub checkpoints are vision-language models: the text settings sit in
`text_config`, the language model's tensors under `model.language_model.`,
the vision tower's (plugd_qwen.qwen3_5_vision) under `model.visual.`. A
prompt holds an image as one "<|image_pad|>" per merged patch
(plugd_qwen.config.qwen3_5_media_tokens), whose embeddings the tower's
grid replaces, and full attention rotates by multimodal positions
(plugd_qwen.positions), kept per sequence by the cache list's last entry.
A checkpoint without the tower (as mlx-lm's text conversions are) runs text
only. Its multi-token-prediction head (`mtp.*`, top level) is Qwen3-Next's, the
model's drafter (plugd.nn.mtp), rotating by the multimodal positions too.

Parameter names follow MLX-converted checkpoints (`language_model.model.layers...`,
`language_model.lm_head`, `vision_tower.`), so those load as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from PIL import Image

from plugd.nn.linear import Linear
from plugd.nn.media import place_media
from plugd.nn.mtp import MTPDrafter
from plugd.nn.pipeline import PipelineLayers, pipeline_layers
from plugd.nn.sharding import split_outputs
from plugd_qwen import qwen3_5_processor, qwen3_next
from plugd_qwen.config import ImageSettings
from plugd_qwen.positions import MRoPE, PositionCache, chunk_positions
from plugd_qwen.qwen3_5_vision import VisionArgs, VisionModel

LANGUAGE_MODEL, VISION_TOWER = "language_model.", "vision_tower."
# Where a checkpoint may keep the language model's tensors, and where this model keeps them relative to it.
TEXT_PREFIXES = {"model.language_model.": "model.", "language_model.": ""}
VISION_PREFIXES = ("model.visual.", "visual.", VISION_TOWER)
MROPE_SECTION = (11, 11, 10)  # Qwen3_5TextRotaryEmbedding's default


@dataclass(frozen=True)
class TextArgs(qwen3_next.ModelArgs):
    mrope_section: tuple[int, ...] = MROPE_SECTION

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> TextArgs:
        rope = config.get("text_config", config).get("rope_parameters") or {}
        return cls(**qwen3_next.hybrid_fields(config), mrope_section=tuple(rope.get("mrope_section", MROPE_SECTION)))


@dataclass(frozen=True)
class ModelArgs:
    text: TextArgs
    vision: VisionArgs | None  # None: the config has no tower
    images: ImageSettings

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> ModelArgs:
        vision = config.get("vision_config")
        return cls(TextArgs.from_dict(config), VisionArgs.from_dict(vision) if vision else None,
                   ImageSettings.of(config))


class GatedDeltaNet(qwen3_next.GatedDeltaNet):
    """Gated DeltaNet with one projection each for q, k and v (together), z, b and a."""

    def make_projections(self, dims: int) -> None:
        self.in_proj_qkv = Linear(dims, 2 * self.key_dim + self.value_dim)
        self.in_proj_z = Linear(dims, self.value_dim)
        self.in_proj_b = Linear(dims, self.value_heads)
        self.in_proj_a = Linear(dims, self.value_heads)

    def project(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array, mx.array]:
        z = self.in_proj_z(x).reshape(*x.shape[:2], self.value_heads, self.value_head_dim)
        return self.in_proj_qkv(x), z, self.in_proj_b(x), self.in_proj_a(x)

    def shard_projections(self, group: mx.distributed.Group) -> None:
        """q, k and v are shared out each on its own; z, b and a by value heads."""
        split_outputs(self.in_proj_qkv, group, segments=[self.key_dim, 2 * self.key_dim])
        for projection in (self.in_proj_z, self.in_proj_b, self.in_proj_a):
            split_outputs(projection, group)


class GatedAttention(qwen3_next.GatedAttention):
    """Qwen3-Next's gated attention, rotated by multimodal positions."""

    def __init__(self, args: TextArgs):
        super().__init__(args)
        self.rope = MRoPE(self.rope.dims, self.rope.base, args.mrope_section)


class TextModel(qwen3_next.Model):
    linear_attention = GatedDeltaNet
    attention = GatedAttention

    def __call__(self, tokens: mx.array, cache: list[qwen3_next.Cache] | None = None,
                 position: int | mx.array | None = None, media: Sequence[tuple[int, mx.array]] = (),
                 return_hidden: bool = False) -> mx.array | tuple[mx.array, mx.array]:
        """Logits of `tokens`, `media` embeddings written over theirs; `position`: what full attention's rotary
        embedding takes (plugd_qwen.positions.MRoPE); with `return_hidden`, (logits, final hidden states)."""
        h = place_media(self.model.embed_tokens(tokens), media)
        for layer, layer_cache in zip(self.model.layers, cache or [None] * len(self.model.layers), strict=True):
            h = layer(h, layer_cache, position)
        hidden = self.model.norm(h)
        return (self.logits(hidden), hidden) if return_hidden else self.logits(hidden)


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.language_model = TextModel(args.text)
        if args.vision is not None:
            self.vision_tower = VisionModel(args.vision)

    def __call__(self, tokens: mx.array, cache: list | None = None, media: Sequence[tuple[int, mx.array]] = (),
                 return_hidden: bool = False) -> mx.array | tuple[mx.array, mx.array]:
        """(batch, length) token ids -> logits (with `return_hidden`, and the final hidden states); each `media`
        item (start, (rows, columns, hidden) grid) replaces the embeddings from `start` on (one sequence only). The
        cache's last entry is the positions'."""
        if cache is None:
            layers, positions = None, PositionCache()
        else:
            *layers, positions = cache
        if any(embedded.ndim != 3 for _, embedded in media):
            raise ValueError("Qwen3.5 takes each image's embeddings as a grid of merged patches")
        images = [(start, *embedded.shape[:2]) for start, embedded in media]
        if images:
            position, lags = chunk_positions(positions.position, tokens.shape[1], images)
        else:
            position, lags = positions.position, ()
        out = self.language_model(tokens, layers, position, media, return_hidden)
        positions.advance(tokens.shape[1], lags)
        return out

    def drafter(self) -> MTPDrafter | None:
        """The language model's multi-token-prediction head as a drafter; None where the checkpoint has none."""
        return self.language_model.drafter()

    def shard(self, group: mx.distributed.Group) -> None:
        """The language model's blocks split as Qwen3-Next's; the vision tower stays whole on every rank."""
        self.language_model.shard(group)

    def pipeline_layers(self) -> PipelineLayers:
        """The language model's layers; the positions' cache, the last in the list, and the vision tower stay on
        every rank."""
        return pipeline_layers(self.language_model)

    def preprocess(self, image: Image.Image) -> mx.array:
        return qwen3_5_processor.preprocess(image, self.args.images, self.args.vision.temporal_patch_size)

    def embed_media(self, patches: mx.array) -> mx.array:
        """(batch, rows, columns, patch dims) preprocessed images -> (batch, rows / 2, columns / 2, text hidden)."""
        if "vision_tower" not in self:
            raise ValueError("this qwen3_5 checkpoint has no vision tower")
        return self.vision_tower(patches)

    def make_cache(self) -> list:
        return [*self.language_model.make_cache(), PositionCache()]

    @property
    def quant_predicate(self):
        return self.language_model.quant_predicate

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """The language model's tensors, named relative to it and folded as Qwen3-Next's are (its multi-token-prediction
        head's too); the tower's under `vision_tower.`, its Conv3d patch embedding as one linear map. Without tower
        tensors the model drops its tower."""
        text, vision = {}, {}
        for name, tensor in weights.items():
            if prefix := next((p for p in VISION_PREFIXES if name.startswith(p)), None):
                vision[VISION_TOWER + name.removeprefix(prefix)] = tensor
            else:
                text[_text_name(name)] = tensor
        if not vision:
            self.pop("vision_tower", None)
        elif (proj := VISION_TOWER + "patch_embed.proj.weight") in vision:
            vision[proj] = _patch_embedding(vision[proj], self.args.vision)
        return {LANGUAGE_MODEL + name: tensor for name, tensor in self.language_model.sanitize(text).items()} | vision


def _patch_embedding(weight: mx.array, vision: VisionArgs) -> mx.array:
    """A Conv3d kernel, as transformers holds it (out, channels, frames, patch, patch) or as MLX does (out, frames,
    patch, patch, channels), as the (out, patch dims) linear map it amounts to."""
    if weight.ndim == 2:
        return weight
    if weight.shape[-1] == vision.in_channels and weight.shape[1] == vision.temporal_patch_size:
        weight = weight.transpose(0, 4, 1, 2, 3)
    return weight.reshape(weight.shape[0], -1)


def _text_name(name: str) -> str:
    for prefix, ours in TEXT_PREFIXES.items():
        if name.startswith(prefix):
            return ours + name.removeprefix(prefix)
    return name
