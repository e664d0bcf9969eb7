"""Gemma 4 text decoder, config.json model_type "gemma4_text" (the dense models).

Like Gemma 3 it interleaves sliding-window and global layers, with
post-attention and post-feed-forward norms and scaled embeddings; unlike it:
- norms scale by `weight` (not 1 + weight), values are RMS-normalised without
  a scale, and attention scores are not scaled (the norms take care of it);
- global layers may use wider heads (`global_head_dim`, or in
  `per_layer_config` as transformers 5 writes it), fewer key/value heads
  with keys doubling as values (`attention_k_eq_v`), and a "proportional"
  rotary embedding over part of each head;
- the last `num_kv_shared_layers` layers compute no keys or values of their
  own: each attends over those of the last earlier layer of its kind, and
  with `use_double_wide_mlp` has a feed-forward twice as wide;
- with `hidden_size_per_layer_input`, every layer adds a gated projection of
  its own slice of a per-layer token embedding (mixed with a projection of
  the input embedding);
- every layer's output is multiplied by a learned `layer_scalar`, and final
  logits are soft-capped;
- with `enable_moe_block` (the 26B-A4B), every layer adds a mixture of GeGLU
  experts to its dense feed-forward (see DecoderLayer.feed_forward).

`media` (used by the gemma4 vision model) replaces the scaled embeddings of
spans of positions with image embeddings before the per-layer inputs project
them; with `use_bidirectional_attention: "vision"` each span attends to
itself in both directions on the sliding layers (global layers stay causal).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from plugd.nn.activations import gelu_approx
from plugd.nn.decoder import DecoderShape, LanguageModel
from plugd.nn.linear import Embedding, Linear
from plugd.nn.media import place_media
from plugd.nn.mlp import GatedMLP
from plugd.nn.norms import RMSNorm
from plugd.nn.pipeline import PipelineLayers
from plugd.nn.sharding import shard_blocks, share, split_inputs, split_outputs
from plugd.nn.switch import routers_at_8_bits
from plugd.nn.switch_mlp import SwitchGLU
from plugd_gemma.common import (
    GemmaRoPE,
    RopeSettings,
    attend,
    attend_shared,
    embedding_scale,
    make_layer_cache,
    rope_settings,
    soft_cap,
)
from plugd_gemma.config import FULL, SLIDING, gemma4_global_heads, layer_types
from plugd_gemma.spans import Span, spans_of

ROPE_DEFAULTS = {
    FULL: {"rope_theta": 1_000_000.0, "rope_type": "proportional", "partial_rotary_factor": 0.25},
    SLIDING: {"rope_theta": 10_000.0, "rope_type": "default"},
}


# Settings a mixture-of-experts config must give.
MOE_KEYS = ("num_experts", "top_k_experts", "moe_intermediate_size")


@dataclass(frozen=True)
class ModelArgs(DecoderShape):
    num_global_key_value_heads: int | None
    head_dim: int
    global_head_dim: int | None
    sliding_window: int
    layer_types: tuple[str, ...]
    rope: Mapping[str, RopeSettings]
    rope_traditional: bool
    attention_k_eq_v: bool
    num_kv_shared_layers: int
    use_double_wide_mlp: bool
    hidden_size_per_layer_input: int
    vocab_size_per_layer_input: int
    final_logit_softcapping: float | None
    tie_word_embeddings: bool
    bidirectional_vision: bool = False
    pad_token_id: int = 0
    num_experts: int = 0
    top_k_experts: int = 0
    moe_intermediate_size: int = 0

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> ModelArgs:
        """Defaults where a key is absent are mlx-lm's (those of the small per-layer-input models)."""
        moe = bool(config.get("enable_moe_block"))
        missing = [key for key in MOE_KEYS if moe and not config.get(key)]
        if missing:
            raise ValueError(f"the mixture-of-experts block (enable_moe_block) needs {', '.join(missing)} in config.json")
        global_head_dim, global_kv_heads = gemma4_global_heads(config)
        return cls(
            **DecoderShape.fields(config),
            num_global_key_value_heads=global_kv_heads,
            head_dim=config.get("head_dim", 256),
            global_head_dim=global_head_dim,
            sliding_window=config.get("sliding_window", 512),
            layer_types=tuple(layer_types(config, default_pattern=5)),
            rope=rope_settings(config, ROPE_DEFAULTS),
            rope_traditional=config.get("rope_traditional", False),
            attention_k_eq_v=config.get("attention_k_eq_v", False),
            num_kv_shared_layers=config.get("num_kv_shared_layers", 20),
            use_double_wide_mlp=config.get("use_double_wide_mlp", True),
            hidden_size_per_layer_input=config.get("hidden_size_per_layer_input", 256) or 0,
            vocab_size_per_layer_input=config.get("vocab_size_per_layer_input", 262144),
            final_logit_softcapping=config.get("final_logit_softcapping", 30.0),
            tie_word_embeddings=config.get("tie_word_embeddings", True),
            bidirectional_vision=config.get("use_bidirectional_attention") == "vision",
            pad_token_id=config.get("pad_token_id", 0),
            **{key: config[key] if moe else 0 for key in MOE_KEYS},
        )

    @property
    def kv_layers(self) -> int:
        """How many leading layers compute keys and values (the rest share them)."""
        return self.num_hidden_layers - self.num_kv_shared_layers

    def kv_source(self, layer: int) -> int:
        """The layer whose keys and values `layer` attends over: itself, or the last KV layer of its kind."""
        if layer < self.kv_layers:
            return layer
        kind = self.layer_types[layer]
        return max(i for i in range(self.kv_layers) if self.layer_types[i] == kind)


class ScalelessRMSNorm(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, None, self.eps)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        kind = args.layer_types[layer]
        full = kind == FULL
        self.head_dim = args.global_head_dim if full and args.global_head_dim else args.head_dim
        self.keys_are_values = args.attention_k_eq_v and full
        self.heads = args.num_attention_heads
        self.kv_heads = args.num_key_value_heads
        if self.keys_are_values and args.num_global_key_value_heads is not None:
            self.kv_heads = args.num_global_key_value_heads
        self.window = None if full else args.sliding_window
        self.q_proj = Linear(args.hidden_size, self.heads * self.head_dim)
        self.o_proj = Linear(self.heads * self.head_dim, args.hidden_size)
        self.q_norm = RMSNorm(self.head_dim, args.rms_norm_eps)
        self.has_kv = layer < args.kv_layers
        if self.has_kv:
            self.k_proj = Linear(args.hidden_size, self.kv_heads * self.head_dim)
            if not self.keys_are_values:
                self.v_proj = Linear(args.hidden_size, self.kv_heads * self.head_dim)
            self.k_norm = RMSNorm(self.head_dim, args.rms_norm_eps)
            self.v_norm = ScalelessRMSNorm(args.rms_norm_eps)
        self.rope = GemmaRoPE(self.head_dim, args.rope[kind], args.rope_traditional)

    def __call__(self, x: mx.array, cache, shared, offset: int, spans: Sequence[Span]):
        """Attend over this layer's own cache, or over `shared` (keys, values, mask) for a KV-sharing layer, with
        `spans` bidirectional. Returns the output and what a later layer of the same kind may share."""
        batch, length, _ = x.shape

        def split_heads(y: mx.array, heads: int) -> mx.array:
            return y.reshape(batch, length, heads, self.head_dim)

        queries = self.rope(self.q_norm(split_heads(self.q_proj(x), self.heads)).transpose(0, 2, 1, 3), offset)
        if self.has_kv:
            raw_keys = split_heads(self.k_proj(x), self.kv_heads)
            raw_values = raw_keys if self.keys_are_values else split_heads(self.v_proj(x), self.kv_heads)
            keys = self.rope(self.k_norm(raw_keys).transpose(0, 2, 1, 3), offset)
            values = self.v_norm(raw_values).transpose(0, 2, 1, 3)
            out, shared = attend(queries, keys, values, 1.0, self.window, cache, spans, offset)
        else:
            out = attend_shared(queries, shared, 1.0)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(batch, length, -1)), shared

    def shard(self, group: mx.distributed.Group) -> None:
        """By heads; a layer that shares an earlier layer's keys and values shares this rank's heads of them."""
        self.heads = share(self.heads, group, "attention heads")
        self.kv_heads = share(self.kv_heads, group, "key/value heads")
        split_outputs(self.q_proj, group)
        for name in ("k_proj", "v_proj"):
            if name in self:
                split_outputs(self[name], group)
        split_inputs(self.o_proj, group)


class Router(nn.Module):
    """Each token's `top_k_experts` experts and their weights, chosen from the residual stream: RMS-normalised,
    scaled by `scale` / sqrt(hidden_size) and projected to a score per expert; the chosen scores are softmaxed
    among themselves and multiplied by the chosen experts' `per_expert_scale`."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.eps, self.top_k = args.rms_norm_eps, args.top_k_experts
        self.root_size = args.hidden_size**-0.5
        self.proj = Linear(args.hidden_size, args.num_experts)
        self.scale = mx.ones((args.hidden_size,))
        self.per_expert_scale = mx.ones((args.num_experts,))

    def __call__(self, x: mx.array) -> tuple[mx.array, mx.array]:
        scores = self.proj(mx.fast.rms_norm(x, self["scale"] * self.root_size, self.eps))
        experts = mx.argpartition(scores, kth=-self.top_k, axis=-1)[..., -self.top_k :]
        weights = mx.softmax(mx.take_along_axis(scores, experts, axis=-1), axis=-1)
        return experts, weights * self["per_expert_scale"][experts]


class Experts(nn.Module):
    """The weighted sum of each token's chosen GeGLU experts."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.switch_glu = SwitchGLU(args.hidden_size, args.moe_intermediate_size, args.num_experts, nn.gelu_approx)

    def __call__(self, x: mx.array, experts: mx.array, weights: mx.array) -> mx.array:
        return (self.switch_glu(x, experts) * weights[..., None]).sum(axis=-2)

    def shard(self, group: mx.distributed.Group) -> None:
        self.switch_glu.shard(group)


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        h, eps = args.hidden_size, args.rms_norm_eps
        self.self_attn = Attention(args, layer)
        wide = args.use_double_wide_mlp and layer >= args.kv_layers > 0
        self.mlp = GatedMLP(h, args.intermediate_size * (2 if wide else 1), gelu_approx)
        self.input_layernorm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.pre_feedforward_layernorm = RMSNorm(h, eps)
        self.post_feedforward_layernorm = RMSNorm(h, eps)
        self.has_experts = args.num_experts > 0
        if self.has_experts:
            self.router = Router(args)
            self.experts = Experts(args)
            self.pre_feedforward_layernorm_2 = RMSNorm(h, eps)
            self.post_feedforward_layernorm_1 = RMSNorm(h, eps)
            self.post_feedforward_layernorm_2 = RMSNorm(h, eps)
        if args.hidden_size_per_layer_input:
            self.per_layer_input_gate = Linear(h, args.hidden_size_per_layer_input)
            self.per_layer_projection = Linear(args.hidden_size_per_layer_input, h)
            self.post_per_layer_input_norm = RMSNorm(h, eps)
        self.layer_scalar = mx.ones((1,))

    def __call__(self, x: mx.array, cache, shared, offset: int, per_layer_input: mx.array | None,
                 spans: Sequence[Span]):
        attended, shared = self.self_attn(self.input_layernorm(x), cache, shared, offset, spans)
        h = x + self.post_attention_layernorm(attended)
        h = h + self.post_feedforward_layernorm(self.feed_forward(h))
        if per_layer_input is not None:
            gate = nn.gelu_approx(self.per_layer_input_gate(h)) * per_layer_input
            h = h + self.post_per_layer_input_norm(self.per_layer_projection(gate))
        return h * self["layer_scalar"], shared

    def feed_forward(self, h: mx.array) -> mx.array:
        """The dense GeGLU MLP; in a MoE layer plus the experts, each output under its own norm. The experts have
        their own pre-norm, and the router reads the residual stream itself."""
        dense = self.mlp(self.pre_feedforward_layernorm(h))
        if not self.has_experts:
            return dense
        routed = self.experts(self.pre_feedforward_layernorm_2(h), *self.router(h))
        return self.post_feedforward_layernorm_1(dense) + self.post_feedforward_layernorm_2(routed)


class Decoder(nn.Module):
    """The checkpoint's `model.` subtree."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embed_tokens = Embedding(args.vocab_size, args.hidden_size)
        self.layers = [DecoderLayer(args, i) for i in range(args.num_hidden_layers)]
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        per_layer = args.hidden_size_per_layer_input
        if per_layer:
            total = args.num_hidden_layers * per_layer
            self.embed_tokens_per_layer = Embedding(args.vocab_size_per_layer_input, total)
            self.per_layer_model_projection = Linear(args.hidden_size, total)
            self.per_layer_projection_norm = RMSNorm(per_layer, args.rms_norm_eps)

    def per_layer_inputs(self, tokens: mx.array, h: mx.array) -> list[mx.array]:
        """Each layer's slice of (per-layer token embedding + normalised projection of `h`) / sqrt(2)."""
        args = self.args
        per_layer, layers = args.hidden_size_per_layer_input, args.num_hidden_layers
        embedded = self.embed_tokens_per_layer(tokens) * per_layer**0.5
        projected = self.per_layer_model_projection(h) * args.hidden_size**-0.5
        projected = self.per_layer_projection_norm(projected.reshape(*h.shape[:2], layers, per_layer))
        mixed = (projected + embedded.reshape(*h.shape[:2], layers, per_layer)) * 2**-0.5
        return [mixed[:, :, i] for i in range(layers)]

    def __call__(self, tokens: mx.array, cache: list, media: Sequence[tuple[int, mx.array]] = ()) -> mx.array:
        h = self.embed_tokens(tokens)
        h = h * embedding_scale(self.args.hidden_size, h.dtype)
        if media:
            h = place_media(h, media)
        per_layer = self.per_layer_inputs(tokens, h) if self.args.hidden_size_per_layer_input else None
        offset = 0 if cache[0] is None else cache[0].offset
        spans = {SLIDING: spans_of(media) if self.args.bidirectional_vision else (), FULL: ()}
        shared: list = []
        for i, layer in enumerate(self.layers):
            source = self.args.kv_source(i)
            layer_cache = cache[i] if source == i else None
            h, kv = layer(h, layer_cache, shared[source] if source != i else None, offset,
                          None if per_layer is None else per_layer[i], spans[self.args.layer_types[i]])
            shared.append(kv)
        return self.norm(h)


class Model(LanguageModel):
    def __init__(self, args: ModelArgs):
        super().__init__(args, Decoder(args))

    def __call__(self, tokens: mx.array, cache: list | None = None, media: Sequence[tuple[int, mx.array]] = ()
                 ) -> mx.array:
        """(batch, length) int32 token ids -> (batch, length, vocab) logits, appending to `cache` when given; `media`
        spans (start, (n, hidden) embeddings) take those embeddings. The cache holds one entry per layer that
        computes keys and values (see make_cache)."""
        h = self.model(tokens, cache if cache is not None else [None] * self.args.kv_layers, media)
        return soft_cap(self.logits(h), self.args.final_logit_softcapping)

    @property
    def quant_predicate(self):
        return routers_at_8_bits("router.proj")

    def make_cache(self) -> list:
        return [make_layer_cache(kind, self.args.sliding_window) for kind in self.args.layer_types[: self.args.kv_layers]]

    def shard(self, group: mx.distributed.Group) -> None:
        """Tensor parallel (plugd.nn.sharding): attention by heads, the dense MLP and every expert by hidden units,
        each summed before the norm that follows it; the router and the per-layer inputs stay whole."""
        shard_blocks(self.model.layers, group, "self_attn", "mlp", "experts")

    def pipeline_layers(self) -> PipelineLayers:
        """No pipeline: besides its output each layer returns its keys and values, which later layers attend
        over, and a stage passes on the hidden states alone."""
        raise ValueError("Gemma 4's layers share keys and values across the model, so they do not split into "
                         "stages")

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Drop rotary tables, activation clipping bounds, KV projections of KV-sharing layers, and a tied lm_head;
        split the experts' fused `experts.gate_up_proj` (experts, 2 * hidden, dims), gate first, into the stacked
        `experts.switch_glu.*` that MLX-converted checkpoints hold (lazily)."""
        weights = super().sanitize(weights)
        for name in [name for name in weights if name.endswith(".experts.gate_up_proj")]:
            prefix = name.removesuffix("gate_up_proj")
            gate, up = mx.split(weights.pop(name), 2, axis=-2)
            weights[prefix + "switch_glu.gate_proj.weight"] = mx.contiguous(gate)
            weights[prefix + "switch_glu.up_proj.weight"] = mx.contiguous(up)
            weights[prefix + "switch_glu.down_proj.weight"] = weights.pop(prefix + "down_proj")
        unused = ("self_attn.k_proj.", "self_attn.v_proj.", "self_attn.k_norm.")
        shared_layers = tuple(f"model.layers.{i}." for i in range(self.args.kv_layers, self.args.num_hidden_layers))
        return {
            name: tensor
            for name, tensor in weights.items()
            if not any(part in name for part in ("self_attn.rotary_emb", "input_max", "input_min", "output_max", "output_min"))
            and not (name.startswith(shared_layers) and any(part in name for part in unused))
        }
