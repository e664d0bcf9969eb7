"""Qwen3, config.json model_type "qwen3": a pre-norm decoder with grouped-query attention,
per-head RMSNorm on queries and keys, and a SwiGLU feed-forward.

Parameter names follow the Hugging Face checkpoint (`model.layers.{i}.self_attn.q_proj.weight`, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from plugd.nn.attention import attend
from plugd.nn.cache import KVCache
from plugd.nn.decoder import DecoderShape, LanguageModel
from plugd.nn.linear import Embedding, Linear
from plugd.nn.mlp import GatedMLP
from plugd.nn.norms import RMSNorm
from plugd.nn.rope import RoPE, rope_base
from plugd.nn.sharding import shard_attention, shard_blocks


@dataclass(frozen=True)
class ModelArgs(DecoderShape):
    head_dim: int
    rope_theta: float
    tie_word_embeddings: bool

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> ModelArgs:
        return cls(**dense_fields(config))


def dense_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ModelArgs fields of a Qwen3 config.json, with transformers' defaults where a key may be absent."""
    return {
        **DecoderShape.fields(config),
        "head_dim": config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
        "rope_theta": rope_base(config),
        "tie_word_embeddings": config.get("tie_word_embeddings", False),
    }


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        heads, kv_heads, head_dim = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        self.heads, self.kv_heads = heads, kv_heads
        self.scale = head_dim**-0.5
        self.q_proj = Linear(args.hidden_size, heads * head_dim)
        self.k_proj = Linear(args.hidden_size, kv_heads * head_dim)
        self.v_proj = Linear(args.hidden_size, kv_heads * head_dim)
        self.o_proj = Linear(heads * head_dim, args.hidden_size)
        self.q_norm = RMSNorm(head_dim, args.rms_norm_eps)
        self.k_norm = RMSNorm(head_dim, args.rms_norm_eps)
        self.rope = RoPE(head_dim, args.rope_theta)

    def __call__(self, x: mx.array, cache: KVCache | None) -> mx.array:
        batch, length, _ = x.shape

        def split_heads(y: mx.array, heads: int) -> mx.array:
            return y.reshape(batch, length, heads, -1)

        # (batch, length, heads, head_dim), normalised per head, then heads before length.
        queries = self.q_norm(split_heads(self.q_proj(x), self.heads)).transpose(0, 2, 1, 3)
        keys = self.k_norm(split_heads(self.k_proj(x), self.kv_heads)).transpose(0, 2, 1, 3)
        values = split_heads(self.v_proj(x), self.kv_heads).transpose(0, 2, 1, 3)
        offset = 0 if cache is None else cache.offset
        queries, keys = self.rope(queries, offset), self.rope(keys, offset)
        if cache is not None:
            keys, values = cache.update_and_fetch(keys, values)
        out = attend(queries, keys, values, self.scale, cache)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(batch, length, -1))

    def shard(self, group: mx.distributed.Group) -> None:
        shard_attention(self, group)


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, mlp: nn.Module):
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = mlp

    def __call__(self, x: mx.array, cache: KVCache | None) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Decoder(nn.Module):
    """The checkpoint's `model.` subtree: embeddings, layers, final norm."""

    def __init__(self, args: ModelArgs, layers: list[DecoderLayer]):
        super().__init__()
        self.embed_tokens = Embedding(args.vocab_size, args.hidden_size)
        self.layers = layers
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def __call__(self, tokens: mx.array, cache: list[KVCache] | list[None]) -> mx.array:
        h = self.embed_tokens(tokens)
        for layer, layer_cache in zip(self.layers, cache, strict=True):
            h = layer(h, layer_cache)
        return self.norm(h)


class Model(LanguageModel):
    def __init__(self, args: ModelArgs):
        layers = [DecoderLayer(args, self.feed_forward(args, i)) for i in range(args.num_hidden_layers)]
        super().__init__(args, Decoder(args, layers))

    def feed_forward(self, args: ModelArgs, layer: int) -> nn.Module:
        """The feed-forward block of layer `layer`; variants override this."""
        return GatedMLP(args.hidden_size, args.intermediate_size)

    def __call__(self, tokens: mx.array, cache: list[KVCache] | None = None) -> mx.array:
        """(batch, length) int32 token ids -> (batch, length, vocab) logits, appending to `cache` when given."""
        h = self.model(tokens, cache if cache is not None else [None] * self.args.num_hidden_layers)
        return self.logits(h)

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in range(self.args.num_hidden_layers)]

    def shard(self, group: mx.distributed.Group) -> None:
        """Tensor parallel: attention by heads, feed-forward blocks by hidden units (plugd.nn.sharding)."""
        shard_blocks(self.model.layers, group, "self_attn", "mlp")
