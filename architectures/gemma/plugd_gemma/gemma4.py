"""Gemma 4 as the hub publishes it, config.json model_type "gemma4" (Gemma4ForConditionalGeneration): the
gemma4_text decoder (dense or mixture-of-experts) with its settings in `text_config` and its tensors under
`model.language_model.`. Only text runs here: the vision and audio towers' tensors are dropped.

Parameter names follow MLX-converted checkpoints (`language_model.model.layers...`), so those load as they are,
their per-layer quantization entries included.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from plugd_gemma import gemma4_text

LANGUAGE_MODEL = "language_model."
# Towers and projections that feed images and audio into the decoder.
MEDIA_PARTS = ("vision_tower", "multi_modal_projector", "audio_tower", "embed_audio", "embed_vision", "vision_embedder")


# Decoder settings the outer config may carry instead of text_config.
OUTER_SETTINGS = ("vocab_size", "tie_word_embeddings")


class ModelArgs(gemma4_text.ModelArgs):
    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> gemma4_text.ModelArgs:
        """gemma4_text's settings, read from `text_config`."""
        text = dict(config.get("text_config") or config)
        for key in OUTER_SETTINGS:
            if key in config:
                text.setdefault(key, config[key])
        return gemma4_text.ModelArgs.from_dict(text)


class Model(nn.Module):
    def __init__(self, args: gemma4_text.ModelArgs):
        super().__init__()
        self.args = args
        self.language_model = gemma4_text.Model(args)

    def __call__(self, tokens: mx.array, cache: list | None = None) -> mx.array:
        return self.language_model(tokens, cache)

    def make_cache(self) -> list:
        return self.language_model.make_cache()

    @property
    def quant_predicate(self):
        return self.language_model.quant_predicate

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Hub names (`model.language_model.X`, `lm_head`) as the decoder's own (`model.X`), its folds applied, all
        under `language_model.`; MLX-converted names pass as they are; media towers are dropped."""
        text = {}
        for name, tensor in weights.items():
            inner = name.removeprefix("model.")
            if inner.startswith(MEDIA_PARTS):
                continue
            if name.startswith(LANGUAGE_MODEL):
                text[name.removeprefix(LANGUAGE_MODEL)] = tensor
            elif inner.startswith(LANGUAGE_MODEL):
                text["model." + inner.removeprefix(LANGUAGE_MODEL)] = tensor
            else:
                text[name] = tensor
        return {LANGUAGE_MODEL + name: tensor for name, tensor in self.language_model.sanitize(text).items()}

