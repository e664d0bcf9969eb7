"""Qwen3.5, config.json model_type "qwen3_5": Qwen3-Next's hybrid decoder (plugd_qwen.qwen3_next) with the
linear attention's projections kept apart (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`) and a
SwiGLU MLP on every layer; its MoE twin (plugd_qwen.qwen3_5_moe) has routed plus shared experts on every layer.

Hub checkpoints are vision-language models: the text settings sit in
`text_config`, the language model's tensors under `model.language_model.`.
Only the language model runs here: the vision tower's tensors are dropped.
Parameter names follow MLX-converted checkpoints (`language_model.model.layers...`,
`language_model.lm_head`), so those load as they are.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from plugd.nn.linear import Linear
from plugd_qwen import qwen3_next

ModelArgs = qwen3_next.ModelArgs
LANGUAGE_MODEL = "language_model."
# Where a checkpoint may keep the language model's tensors, and where this model keeps them relative to it.
TEXT_PREFIXES = {"model.language_model.": "model.", "language_model.": ""}
VISION_PREFIXES = ("model.visual.", "visual.", "vision_tower.")


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


class TextModel(qwen3_next.Model):
    linear_attention = GatedDeltaNet


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.language_model = TextModel(args)

    def __call__(self, tokens: mx.array, cache: list[qwen3_next.Cache] | None = None) -> mx.array:
        return self.language_model(tokens, cache)

    def make_cache(self) -> list[qwen3_next.Cache]:
        return self.language_model.make_cache()

    @property
    def quant_predicate(self):
        return self.language_model.quant_predicate

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """The language model's tensors, named relative to it and folded as Qwen3-Next's are (multi-token-prediction
        weights dropped on purpose there); the vision tower's are dropped, since only text runs here."""
        text = {_text_name(name): tensor for name, tensor in weights.items() if not name.startswith(VISION_PREFIXES)}
        return {LANGUAGE_MODEL + name: tensor for name, tensor in self.language_model.sanitize(text).items()}


def _text_name(name: str) -> str:
    for prefix, ours in TEXT_PREFIXES.items():
        if name.startswith(prefix):
            return ours + name.removeprefix(prefix)
    return name
