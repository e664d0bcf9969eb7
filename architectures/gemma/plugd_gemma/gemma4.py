"""Gemma 4 as the hub publishes it, config.json model_type "gemma4" (Gemma4ForConditionalGeneration): the
gemma4_text decoder (dense or mixture-of-experts) with its settings in `text_config` and its tensors under
`model.language_model.`, and the vision tower (plugd_gemma.gemma4_vision) with its projection `embed_vision`.

A prompt holds each image as "<|image>", one image token per soft token, and
"<image|>" (plugd_gemma.config.gemma4_media_tokens); the image tokens read
as the pad token for the per-layer inputs. A checkpoint without the tower
(as mlx-lm's text conversions are) runs text only; the audio tower is never
run, and its tensors are dropped.

Parameter names follow MLX-converted checkpoints (`language_model.model.layers...`, `vision_tower.`,
`embed_vision.`), so those load as they are, their per-layer quantization entries included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from PIL import Image

from plugd.nn.pipeline import PipelineLayers
from plugd_gemma import gemma4_processor, gemma4_text
from plugd_gemma.config import gemma4_vision_settings
from plugd_gemma.gemma4_vision import MultimodalEmbedder, VisionArgs, VisionModel

LANGUAGE_MODEL = "language_model."
VISION_PARTS = ("vision_tower.", "embed_vision.")
AUDIO_PARTS = ("audio_tower", "embed_audio")
# Decoder settings the outer config may carry instead of text_config.
OUTER_SETTINGS = ("vocab_size", "tie_word_embeddings")


class ModelArgs:
    def __init__(self, text: gemma4_text.ModelArgs, vision: VisionArgs | None, config: Mapping[str, Any]):
        self.text, self.vision = text, vision
        self.patch_size, self.pooling_kernel_size, self.soft_tokens = gemma4_vision_settings(config)
        self.image_token_id = config.get("image_token_id", 258_880)

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> ModelArgs:
        """gemma4_text's settings, read from `text_config`; the tower's from `vision_config`, when there is one."""
        text = dict(config.get("text_config") or config)
        for key in OUTER_SETTINGS:
            if key in config:
                text.setdefault(key, config[key])
        vision = config.get("vision_config")
        return cls(gemma4_text.ModelArgs.from_dict(text), VisionArgs.from_dict(vision) if vision else None, config)


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.language_model = gemma4_text.Model(args.text)
        if args.vision is not None:
            self.vision_tower = VisionModel(args.vision)
            self.embed_vision = MultimodalEmbedder(args.vision.hidden_size, args.text.hidden_size,
                                                   args.vision.rms_norm_eps)

    def __call__(self, tokens: mx.array, cache: list | None = None, media: Sequence[tuple[int, mx.array]] = ()
                 ) -> mx.array:
        """(1, length) token ids -> logits; each `media` item (start, (n, hidden) embeddings) replaces the inputs'
        embeddings from `start` on, its positions read as the pad token for the per-layer inputs."""
        if media:
            positions = mx.arange(tokens.shape[1])
            inside = mx.zeros(positions.shape, mx.bool_)
            for start, rows in media:
                inside = inside | ((positions >= start) & (positions < start + rows.shape[0]))
            tokens = mx.where(inside[None], self.args.text.pad_token_id, tokens)
        return self.language_model(tokens, cache, media)

    def preprocess(self, image: Image.Image) -> mx.array:
        args = self.args
        return gemma4_processor.preprocess(image, args.patch_size, args.pooling_kernel_size, args.soft_tokens)

    def embed_media(self, patches: mx.array) -> mx.array:
        """(batch, rows, columns, patch pixels) preprocessed images -> (batch, soft tokens, text hidden), lazily."""
        if "vision_tower" not in self:
            raise ValueError("this gemma4 checkpoint has no vision tower")
        return self.embed_vision(self.vision_tower(patches))

    def make_cache(self) -> list:
        return self.language_model.make_cache()

    def shard(self, group: mx.distributed.Group) -> None:
        """The language model splits as Gemma 4's text model; the vision tower stays whole on every rank."""
        self.language_model.shard(group)

    def pipeline_layers(self) -> PipelineLayers:
        return self.language_model.pipeline_layers()

    @property
    def quant_predicate(self):
        return self.language_model.quant_predicate

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Hub names (`model.language_model.X`, `lm_head`) as the decoder's own (`model.X`), its folds applied, all
        under `language_model.`; the tower's as `vision_tower.` and `embed_vision.`; MLX-converted names pass as
        they are; audio tensors are dropped. Without tower tensors the model drops its tower."""
        text, vision = {}, {}
        for name, tensor in weights.items():
            inner = name.removeprefix("model.")
            if inner.startswith(AUDIO_PARTS):
                continue
            if inner.startswith(VISION_PARTS):
                vision[inner] = tensor
            elif name.startswith(LANGUAGE_MODEL):
                text[name.removeprefix(LANGUAGE_MODEL)] = tensor
            elif inner.startswith(LANGUAGE_MODEL):
                text["model." + inner.removeprefix(LANGUAGE_MODEL)] = tensor
            else:
                text[name] = tensor
        if not vision:
            for part in ("vision_tower", "embed_vision"):
                self.pop(part, None)
        vision = {name: tensor for name, tensor in vision.items() if "rotary_emb" not in name}
        return {LANGUAGE_MODEL + name: tensor for name, tensor in self.language_model.sanitize(text).items()} | vision
