"""Gemma 3 with its vision tower, config.json model_type "gemma3" (Gemma3ForConditionalGeneration checkpoints).

The language model is gemma3_text. Images go through the SigLIP tower
(plugd_gemma.siglip); the projector average-pools its patch grid down to
`mm_tokens_per_image` tokens, RMS-normalises them (Gemma's 1 + weight) and
maps them to the text width with a plain (vision, text) matrix. A prompt
holds each image as "<start_of_image>", `mm_tokens_per_image` image soft
tokens whose embeddings the projector's output replaces, and "<end_of_image>"
(plugd_gemma.config.gemma3_media_tokens).

Checkpoints come in three layouts, all read here: the hub's
(`language_model.model.`, `vision_tower.vision_model.`, `multi_modal_projector.`),
transformers 5's save_pretrained (the same without `vision_model.`) and
transformers 5's in-memory names (`model.language_model.`, `model.vision_tower.`,
`model.multi_modal_projector.`, `lm_head.`). Parameters are named as the hub's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from PIL import Image

from plugd.nn.pipeline import PipelineLayers, pipeline_layers
from plugd_gemma import gemma3_processor, gemma3_text
from plugd_gemma.siglip import VisionArgs, VisionModel, patch_weight_channels_last

# Gemma3TextConfig's defaults, for hub configs whose text_config leaves them out.
TEXT_DEFAULTS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
}
# Weight-name prefixes of the other layouts, each with its hub equivalent; the first match applies.
RENAMES = (
    ("model.language_model.", "language_model.model."),
    ("model.vision_tower.vision_model.", "vision_tower.vision_model."),
    ("model.vision_tower.", "vision_tower.vision_model."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("lm_head.", "language_model.lm_head."),
    ("vision_tower.vision_model.", "vision_tower.vision_model."),
    ("vision_tower.", "vision_tower.vision_model."),
)


@dataclass(frozen=True)
class ModelArgs:
    text: gemma3_text.ModelArgs
    vision: VisionArgs
    mm_tokens_per_image: int
    image_token_index: int

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> ModelArgs:
        text_config = {**TEXT_DEFAULTS, **(config.get("text_config") or {})}
        if "vocab_size" not in (config.get("text_config") or {}) and "vocab_size" in config:
            text_config["vocab_size"] = config["vocab_size"]
        text_config.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", True))
        if text_config.get("use_bidirectional_attention"):
            raise ValueError("use_bidirectional_attention (bidirectional text attention) is not supported")
        args = cls(
            text=gemma3_text.ModelArgs.from_dict(text_config),
            vision=VisionArgs.from_dict(config.get("vision_config") or {}),
            mm_tokens_per_image=config.get("mm_tokens_per_image", 256),
            image_token_index=config.get("image_token_index", 262_144),
        )
        side = round(args.mm_tokens_per_image**0.5)
        if side * side != args.mm_tokens_per_image or args.vision.patches_per_side % side:
            raise ValueError(
                f"mm_tokens_per_image {args.mm_tokens_per_image} must be a square whose side divides the "
                f"{args.vision.patches_per_side} patches per side"
            )
        return args


class Projector(nn.Module):
    """(batch, patches, vision hidden) tower output -> (batch, mm_tokens_per_image, text hidden)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        vision = args.vision
        self.patches_per_side = vision.patches_per_side
        self.tokens_per_side = round(args.mm_tokens_per_image**0.5)
        self.mm_input_projection_weight = mx.zeros((vision.hidden_size, args.text.hidden_size))
        self.mm_soft_emb_norm = gemma3_text.RMSNorm(vision.hidden_size, vision.layer_norm_eps)

    def __call__(self, patches: mx.array) -> mx.array:
        batch, _, dims = patches.shape
        side, kernel = self.tokens_per_side, self.patches_per_side // self.tokens_per_side
        pooled = patches.reshape(batch, side, kernel, side, kernel, dims).mean(axis=(2, 4))
        pooled = pooled.reshape(batch, side * side, dims)
        return self.mm_soft_emb_norm(pooled) @ self["mm_input_projection_weight"]


class VisionTower(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.vision_model = VisionModel(args)


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.language_model = gemma3_text.Model(args.text)
        self.vision_tower = VisionTower(args.vision)
        self.multi_modal_projector = Projector(args)

    def __call__(
        self, inputs: mx.array, cache: list | None = None, media: Sequence[tuple[int, mx.array]] = ()
    ) -> mx.array:
        """(1, length) token ids -> logits; each `media` item (start, (n, hidden) embeddings) replaces the inputs'
        embeddings from `start` on and attends to itself in both directions."""
        return self.language_model(inputs, cache, media)

    def preprocess(self, image: Image.Image) -> mx.array:
        return gemma3_processor.preprocess(image, self.args.vision.image_size)

    def embed_media(self, pixels: mx.array) -> mx.array:
        """(batch, H, W, C) preprocessed images -> (batch, mm_tokens_per_image, text hidden), lazily."""
        dtype = self.multi_modal_projector.mm_input_projection_weight.dtype
        return self.multi_modal_projector(self.vision_tower.vision_model(pixels.astype(dtype)))

    def make_cache(self) -> list:
        return self.language_model.make_cache()

    def shard(self, group: mx.distributed.Group) -> None:
        """The language model splits as Gemma 3's text model; the vision tower stays whole on every rank."""
        self.language_model.shard(group)

    def pipeline_layers(self) -> PipelineLayers:
        """The language model's layers; the vision tower stays on every rank."""
        return pipeline_layers(self.language_model)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        renamed = {hub_name(name): tensor for name, tensor in weights.items()}
        if not any(name.startswith("vision_tower.") for name in renamed):
            raise ValueError("this gemma3 checkpoint has no vision tower (a text-only conversion, as mlx-lm writes)")
        patch = "vision_tower.vision_model.embeddings.patch_embedding.weight"
        if patch in renamed:
            renamed[patch] = patch_weight_channels_last(renamed[patch], self.args.vision.num_channels)
        if self.args.text.tie_word_embeddings:
            renamed.pop("language_model.lm_head.weight", None)
        return renamed


def hub_name(name: str) -> str:
    for prefix, hub_prefix in RENAMES:
        if name.startswith(prefix):
            return hub_prefix + name.removeprefix(prefix)
    return name
