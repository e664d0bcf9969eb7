"""Nemotron-H Omni, config.json model_type "nemotron_h_omni" (transformers' NemotronH_Omni_Reasoning_V3): the
nemotron_h language model with the RADIO vision tower (plugd_nemotron.radio).

An image's patches go through the tower; where the language model carries
multi-token-prediction layers the features pass a final LayerNorm (the
checkpoint has one only then); each 2 x 2 patches are then pixel-shuffled
into one vector and projected (RMS norm, linear, squared ReLU, linear) to the
text width. The prompt holds the image as "<img>", one "<image>" per such
vector and "</img>" (plugd_nemotron.omni_config); their embeddings replace
those tokens'. The audio tower and the video projection are not run, and
their tensors are dropped; a checkpoint without the tower runs text only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from PIL import Image

from plugd.nn.linear import TowerLinear
from plugd.nn.norms import LayerNorm, RMSNorm
from plugd.nn.pipeline import PipelineLayers
from plugd_nemotron import nemotron_h, omni_processor
from plugd_nemotron.omni_config import patch_budget, shuffle_factor, text_config
from plugd_nemotron.radio import RadioArgs, RadioModel

VISION_PARTS = ("vision_model.", "vision_final_layernorm.", "multi_modal_projector.")
# Parts of the tower Omni does not run: the input normalisation (the processor normalises), the summary token
# choice, and the projection of video frames.
UNUSED = ("vision_model.input_conditioner.", "vision_model.summary_idxs", "vision_model.embeddings.video_patch_projection.")
# The hub's names (the original RADIO code's, which transformers' save_pretrained writes back), each with ours;
# the first match applies. `mlp1` is the projector as a sequence: norm, linear, activation, linear.
HUB_NAMES = (
    ("vision_model.radio_model.model.patch_generator.cls_token.token", "vision_model.embeddings.cls_register_token"),
    ("vision_model.radio_model.model.patch_generator.embedder.", "vision_model.embeddings.patch_projection."),
    ("vision_model.radio_model.model.patch_generator.pos_embed", "vision_model.embeddings.position_embedding"),
    ("vision_model.radio_model.model.patch_generator.video_embedder.", "vision_model.embeddings.video_patch_projection."),
    ("vision_model.radio_model.model.blocks.", "vision_model.encoder.layer."),
    ("vision_model.radio_model.summary_idxs", "vision_model.summary_idxs"),
    ("vision_model.radio_model.input_conditioner.", "vision_model.input_conditioner."),
    ("vision_projector.vision_final_layernorm.", "vision_final_layernorm."),
    ("mlp1.0.", "multi_modal_projector.layer_norm."),
    ("mlp1.1.", "multi_modal_projector.linear_1."),
    ("mlp1.3.", "multi_modal_projector.linear_2."),
)
HUB_LAYER_NAMES = (("attn.proj.", "attention.o_proj."),)


class ModelArgs:
    def __init__(self, config: Mapping[str, Any]):
        self.text = nemotron_h.ModelArgs.from_dict(text_config(config))
        self.vision = RadioArgs.from_dict(config.get("vision_config") or {})
        self.merge = shuffle_factor(config)
        self.patch_budget = patch_budget(config)
        self.projector_hidden_size = config.get("projector_hidden_size", 4096)
        self.final_norm = (text_config(config).get("num_nextn_predict_layers") or 0) > 0

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> ModelArgs:
        return cls(config)


class Projector(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        dims = args.vision.hidden_size * args.merge**2
        self.layer_norm = RMSNorm(dims, 1e-5)
        self.linear_1 = TowerLinear(dims, args.projector_hidden_size, bias=False)
        self.linear_2 = TowerLinear(args.projector_hidden_size, args.text.hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear_2(nn.relu2(self.linear_1(self.layer_norm(x))))


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.language_model = nemotron_h.Model(args.text)
        self.vision_model = RadioModel(args.vision)
        if args.final_norm:
            self.vision_final_layernorm = LayerNorm(args.vision.hidden_size, args.vision.layer_norm_eps)
        self.multi_modal_projector = Projector(args)

    def __call__(self, tokens: mx.array, cache: list | None = None, media: Sequence[tuple[int, mx.array]] = ()
                 ) -> mx.array:
        return self.language_model(tokens, cache, media)

    def shard(self, group: mx.distributed.Group) -> None:
        """The language model splits as Nemotron-H's; the vision tower stays whole on every rank."""
        self.language_model.shard(group)

    def pipeline_layers(self) -> PipelineLayers:
        """The language model's blocks; the vision tower stays on every rank."""
        return self.language_model.pipeline_layers()

    def preprocess(self, image: Image.Image) -> mx.array:
        return omni_processor.preprocess(image, self.args.vision.patch_size, self.args.merge, self.args.patch_budget)

    def embed_media(self, patches: mx.array) -> mx.array:
        """(batch, rows, columns, patch_dim) preprocessed images -> (batch, rows * columns / merge^2, text hidden),
        lazily."""
        if "vision_model" not in self:
            raise ValueError("this nemotron_h_omni checkpoint has no vision tower")
        batch, rows, columns, _ = patches.shape
        features = self.vision_model(patches)
        if self.args.final_norm:
            features = self.vision_final_layernorm(features)
        return self.multi_modal_projector(pixel_shuffled(features.reshape(batch, rows, columns, -1), self.args.merge))

    def make_cache(self) -> list:
        return self.language_model.make_cache()

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """The language model's tensors folded as nemotron_h's, under `language_model.`; the tower's and the
        projector's in transformers' names (hub names renamed, the tower's fused qkv split); audio and video
        tensors dropped."""
        text, vision = {}, {}
        for name, tensor in weights.items():
            if name.startswith("language_model."):
                text[name.removeprefix("language_model.")] = tensor
                continue
            name = ours(name)
            if name.endswith((".attn.qkv.weight", ".attn.qkv.bias")):
                prefix, kind = name.rsplit(".attn.qkv.", 1)
                for part, piece in zip("qkv", mx.split(tensor, 3, axis=0), strict=True):
                    vision[f"{prefix}.attention.{part}_proj.{kind}"] = piece
            elif name.startswith(VISION_PARTS) and not name.startswith(UNUSED):
                vision[name] = tensor
        if not vision:  # a checkpoint without its tower runs text only
            for part in ("vision_model", "vision_final_layernorm", "multi_modal_projector"):
                self.pop(part, None)
        return {"language_model." + name: tensor for name, tensor in self.language_model.sanitize(text).items()} | vision


def ours(name: str) -> str:
    """A tower or projector tensor's name in transformers' layout, which this model's parameters follow."""
    for hub, renamed in HUB_NAMES:
        if name.startswith(hub):
            name = renamed + name.removeprefix(hub)
            break
    for hub, renamed in HUB_LAYER_NAMES:
        name = name.replace(hub, renamed)
    return name


def pixel_shuffled(grid: mx.array, merge: int) -> mx.array:
    """(batch, rows, columns, dims) -> (batch, rows * columns / merge^2, dims * merge^2): each merge x merge block
    of the grid in one vector, blocks and their parts in the order of transformers' pixel shuffle."""
    batch, rows, columns, dims = grid.shape
    x = grid.reshape(batch, rows, columns // merge, dims * merge).transpose(0, 2, 1, 3)
    x = x.reshape(batch, columns // merge, rows // merge, dims * merge * merge).transpose(0, 2, 1, 3)
    return x.reshape(batch, -1, dims * merge * merge)
