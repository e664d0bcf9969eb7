"""Gemma 3 text decoder, config.json model_type "gemma3_text".

Sliding-window layers (a rotating cache of `sliding_window` positions, local
rotary base) interleave with global layers (a full cache, global rotary base,
possibly linearly scaled). Norms scale by (1 + weight); each block normalises
attention and feed-forward outputs before adding them back; embeddings are
scaled by sqrt(hidden_size); attention scores are scaled by
query_pre_attn_scalar ** -0.5. Parameter names follow the Hugging Face checkpoint.

`media` (used by the gemma3 vision model) replaces the scaled embeddings of
spans of positions with image embeddings and lets each span attend to itself
in both directions (plugd_gemma.spans); without it the masks are the plain
causal and sliding-window ones. A config with `use_bidirectional_attention`
(EmbeddingGemma) is an embedding model's, whose hidden states see both ways.
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
from plugd.nn.sharding import shard_attention, shard_blocks
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
from plugd_gemma.config import FULL, SLIDING, layer_types
from plugd_gemma.spans import Span, spans_of

ROPE_DEFAULTS = {FULL: {"rope_theta": 1_000_000.0}, SLIDING: {"rope_theta": 10_000.0}}


@dataclass(frozen=True)
class ModelArgs(DecoderShape):
    head_dim: int
    query_pre_attn_scalar: float
    sliding_window: int
    layer_types: tuple[str, ...]
    rope: Mapping[str, RopeSettings]
    final_logit_softcapping: float | None
    tie_word_embeddings: bool
    bidirectional: bool = False  # EmbeddingGemma: every position sees those after it too

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> ModelArgs:
        if config.get("attn_logit_softcapping") is not None:
            raise ValueError("attention logit soft-capping is not supported (Gemma 3 checkpoints do not use it)")
        return cls(
            **DecoderShape.fields(config),
            head_dim=config.get("head_dim", 256),
            query_pre_attn_scalar=config.get("query_pre_attn_scalar", 256),
            sliding_window=config.get("sliding_window", 4096),
            layer_types=tuple(layer_types(config, default_pattern=6)),
            rope=rope_settings(config, ROPE_DEFAULTS),
            final_logit_softcapping=config.get("final_logit_softcapping"),
            tie_word_embeddings=config.get("tie_word_embeddings", True),
            bidirectional=config.get("use_bidirectional_attention", False),
        )


class RMSNorm(nn.Module):
    """Gemma's RMSNorm: x / rms(x) * (1 + weight), so a zero weight is the identity scale."""

    def __init__(self, dims: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = mx.zeros((dims,))

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, 1.0 + self["weight"], self.eps)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, kind: str):
        super().__init__()
        heads, kv_heads, head_dim = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        self.heads, self.kv_heads = heads, kv_heads
        self.scale = args.query_pre_attn_scalar**-0.5
        self.window = args.sliding_window if kind == SLIDING else None
        self.q_proj = Linear(args.hidden_size, heads * head_dim)
        self.k_proj = Linear(args.hidden_size, kv_heads * head_dim)
        self.v_proj = Linear(args.hidden_size, kv_heads * head_dim)
        self.o_proj = Linear(heads * head_dim, args.hidden_size)
        self.q_norm = RMSNorm(head_dim, args.rms_norm_eps)
        self.k_norm = RMSNorm(head_dim, args.rms_norm_eps)
        self.rope = GemmaRoPE(head_dim, args.rope[kind])

    def __call__(self, x: mx.array, cache, spans: Sequence[Span] = (), mask: mx.array | None = None) -> mx.array:
        batch, length, _ = x.shape

        def heads_first(y: mx.array, heads: int) -> mx.array:
            return y.reshape(batch, length, heads, -1).transpose(0, 2, 1, 3)

        queries = self.q_norm(heads_first(self.q_proj(x), self.heads))
        keys = self.k_norm(heads_first(self.k_proj(x), self.kv_heads))
        values = heads_first(self.v_proj(x), self.kv_heads)
        offset = 0 if cache is None else cache.offset
        queries, keys = self.rope(queries, offset), self.rope(keys, offset)
        if mask is not None:  # given whole by the caller, for a cacheless pass
            out = attend_shared(queries, (keys, values, mask), self.scale)
        else:
            out, _ = attend(queries, keys, values, self.scale, self.window, cache, spans, offset)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(batch, length, -1))

    def shard(self, group: mx.distributed.Group) -> None:
        shard_attention(self, group)


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, kind: str):
        super().__init__()
        eps = args.rms_norm_eps
        self.self_attn = Attention(args, kind)
        self.mlp = GatedMLP(args.hidden_size, args.intermediate_size, gelu_approx)
        self.input_layernorm = RMSNorm(args.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, eps)
        self.pre_feedforward_layernorm = RMSNorm(args.hidden_size, eps)
        self.post_feedforward_layernorm = RMSNorm(args.hidden_size, eps)

    def __call__(self, x: mx.array, cache, spans: Sequence[Span] = (), mask: mx.array | None = None) -> mx.array:
        h = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cache, spans, mask))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class Decoder(nn.Module):
    """The checkpoint's `model.` subtree: embeddings, layers, final norm."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.hidden_size = args.hidden_size
        self.embed_tokens = Embedding(args.vocab_size, args.hidden_size)
        self.kinds = args.layer_types
        self.layers = [DecoderLayer(args, kind) for kind in args.layer_types]
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def __call__(self, tokens: mx.array, cache: list, media: Sequence[tuple[int, mx.array]] = (),
                 masks: Mapping[str, mx.array] | None = None) -> mx.array:
        """`masks`, by layer kind, replace the causal and sliding-window masks of a cacheless pass."""
        h = self.embed_tokens(tokens)
        h = h * embedding_scale(self.hidden_size, h.dtype)
        if media:
            h = place_media(h, media)
        spans = spans_of(media)
        for kind, layer, layer_cache in zip(self.kinds, self.layers, cache, strict=True):
            h = layer(h, layer_cache, spans, None if masks is None else masks[kind])
        return self.norm(h)


class Model(LanguageModel):
    def __init__(self, args: ModelArgs):
        super().__init__(args, Decoder(args))

    def __call__(self, tokens: mx.array, cache: list | None = None, media: Sequence[tuple[int, mx.array]] = ()) -> mx.array:
        """(batch, length) int32 token ids -> (batch, length, vocab) logits, appending to `cache` when given; `media`
        spans (start, (n, hidden) embeddings) take those embeddings and attend bidirectionally."""
        h = self.model(tokens, cache if cache is not None else [None] * self.args.num_hidden_layers, media)
        return soft_cap(self.logits(h), self.args.final_logit_softcapping)

    def make_cache(self) -> list:
        return [make_layer_cache(kind, self.args.sliding_window) for kind in self.args.layer_types]

    def shard(self, group: mx.distributed.Group) -> None:
        """Tensor parallel (plugd.nn.sharding): attention by heads, the MLP by hidden units, each summed before
        the norm that follows it."""
        shard_blocks(self.model.layers, group, "self_attn", "mlp")

    def hidden_states(self, tokens: mx.array, lengths: mx.array) -> mx.array:
        """As a decoder's, but a bidirectional model's positions see every real position of their row (global
        layers) or those fewer than `sliding_window // 2 + 1` away on either side (sliding ones: the config's
        window spans both sides), as transformers masks EmbeddingGemma; a padding position sees itself too, so
        that nothing it computes is NaN."""
        if not self.args.bidirectional:
            return super().hidden_states(tokens, lengths)
        positions = mx.arange(tokens.shape[1])
        real = (positions[None, :] < lengths[:, None])[:, None, None, :]
        itself = positions[:, None] == positions[None, :]
        near = mx.abs(positions[:, None] - positions[None, :]) < self.args.sliding_window // 2 + 1
        masks = {FULL: real | itself, SLIDING: (real & near) | itself}
        return self.model(tokens, [None] * self.args.num_hidden_layers, masks=masks)
