"""Qwen3-Next, config.json model_type "qwen3_next": a hybrid decoder whose layers alternate Gated DeltaNet
linear attention with gated full attention (every `full_attention_interval`-th layer, or as `layer_types`
says), with a mixture of experts plus a gated shared expert as feed-forward (a SwiGLU MLP on
`mlp_only_layers`).

- Gated DeltaNet: one packed projection holds, per key head, its query, key,
  values and output gates (`in_proj_qkvz`), another its write strengths and
  decay inputs (`in_proj_ba`); a short causal convolution over q, k and v;
  the gated delta rule (plugd.nn.gated_delta); a per-head RMS norm gated by
  silu(z).
- Gated attention: the query projection yields, per head, the query and a
  gate; the output is multiplied by sigmoid(gate). RoPE covers the first
  `partial_rotary_factor` of each head.
- The checkpoint's RMS norms (but the gated one) store weight - 1;
  `sanitize` adds the 1 back when it reads a Hugging Face checkpoint.
- Multi-token prediction (`mtp.*`, where the config announces one layer of it and the checkpoint carries it;
  mlx-lm's conversions drop it): `MultiTokenPredictor`, the model's drafter (plugd.nn.mtp).

Parameter names follow the Hugging Face checkpoint, with the experts stacked
as MLX-converted checkpoints hold them (`mlp.switch_mlp.gate_proj.weight`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from plugd.nn.attention import attend
from plugd.nn.cache import KVCache
from plugd.nn.decoder import LanguageModel
from plugd.nn.gated_delta import gated_delta, gates, normalize_qk
from plugd.nn.linear import Linear
from plugd.nn.mlp import GatedMLP
from plugd.nn.mtp import HeadDrafter, MTPDrafter
from plugd.nn.norms import RMSNorm
from plugd.nn.recurrent import RecurrentCache
from plugd.nn.rope import RoPE
from plugd.nn.sharding import part, shard_attention, shard_blocks, share, split_inputs, split_outputs
from plugd.nn.short_conv import ShortConv, fold_conv_weights
from plugd.nn.switch import routers_at_8_bits, stack_experts
from plugd_qwen import qwen3, qwen3_moe
from plugd_qwen.config import LINEAR, MTP, layer_types

# RMS norms whose checkpoint weight is stored as weight - 1 (output = norm(x) * (1 + weight)).
ZERO_CENTRED_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                      ".q_norm.weight", ".k_norm.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight",
                      "mtp.pre_fc_norm_hidden.weight")

Cache = RecurrentCache | KVCache


@dataclass(frozen=True)
class ModelArgs(qwen3_moe.ModelArgs):
    shared_expert_intermediate_size: int
    partial_rotary_factor: float
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    layer_types: tuple[str, ...]
    mtp_layers: int = 0

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> ModelArgs:
        return cls(**hybrid_fields(config))

    def is_linear(self, layer: int) -> bool:
        return self.layer_types[layer] == LINEAR


def hybrid_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """ModelArgs fields from a Qwen3-Next or Qwen3.5 config.json of either vintage, flat or with `text_config`.

    A top-level `tie_word_embeddings` applies unless text_config says
    otherwise. Without `norm_topk_prob` the top-k router weights are
    normalised, as transformers does.
    """
    text = {"tie_word_embeddings": config.get("tie_word_embeddings", False), **config.get("text_config", config)}
    rope = text.get("rope_parameters") or {}
    return {
        # Qwen3.5-MoE configs have no dense intermediate_size: every layer is sparse.
        **qwen3.dense_fields({"intermediate_size": 0, **text}),
        # transformers 5 renamed num_experts to num_local_experts.
        "num_experts": text.get("num_experts", text.get("num_local_experts", 0)),
        "num_experts_per_tok": text.get("num_experts_per_tok", 0),
        "moe_intermediate_size": text.get("moe_intermediate_size", 0),
        "decoder_sparse_step": text.get("decoder_sparse_step", 1),
        "mlp_only_layers": tuple(text.get("mlp_only_layers") or ()),
        "norm_topk_prob": text.get("norm_topk_prob", True),
        "shared_expert_intermediate_size": text.get("shared_expert_intermediate_size", 0),
        "partial_rotary_factor": text.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.25)),
        "linear_num_key_heads": text["linear_num_key_heads"],
        "linear_num_value_heads": text["linear_num_value_heads"],
        "linear_key_head_dim": text["linear_key_head_dim"],
        "linear_value_head_dim": text["linear_value_head_dim"],
        "linear_conv_kernel_dim": text.get("linear_conv_kernel_dim", 4),
        "layer_types": layer_types(text),
        "mtp_layers": text.get("mtp_num_hidden_layers", text.get("num_nextn_predict_layers", 0)),
    }


class GatedAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        heads, kv_heads, head_dim = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        self.heads, self.kv_heads = heads, kv_heads
        self.scale = head_dim**-0.5
        self.q_proj = Linear(args.hidden_size, 2 * heads * head_dim)
        self.k_proj = Linear(args.hidden_size, kv_heads * head_dim)
        self.v_proj = Linear(args.hidden_size, kv_heads * head_dim)
        self.o_proj = Linear(heads * head_dim, args.hidden_size)
        self.q_norm = RMSNorm(head_dim, args.rms_norm_eps)
        self.k_norm = RMSNorm(head_dim, args.rms_norm_eps)
        self.rope = RoPE(int(head_dim * args.partial_rotary_factor), args.rope_theta)

    def __call__(self, x: mx.array, cache: KVCache | None, position: int | mx.array | None = None) -> mx.array:
        """`position`: what the rotary embedding takes (the cache's offset when None)."""
        batch, length, _ = x.shape
        queries, gate = mx.split(self.q_proj(x).reshape(batch, length, self.heads, -1), 2, axis=-1)
        queries = self.q_norm(queries).transpose(0, 2, 1, 3)
        keys = self.k_norm(self.k_proj(x).reshape(batch, length, self.kv_heads, -1)).transpose(0, 2, 1, 3)
        values = self.v_proj(x).reshape(batch, length, self.kv_heads, -1).transpose(0, 2, 1, 3)
        if position is None:
            position = 0 if cache is None else cache.offset
        queries, keys = self.rope(queries, position), self.rope(keys, position)
        if cache is not None:
            keys, values = cache.update_and_fetch(keys, values)
        out = attend(queries, keys, values, self.scale, cache).transpose(0, 2, 1, 3)
        return self.o_proj((out * mx.sigmoid(gate)).reshape(batch, length, -1))

    def shard(self, group: mx.distributed.Group) -> None:
        """By heads: q_proj holds each head's queries and output gate side by side, so a share of its rows is a
        share of whole heads."""
        shard_attention(self, group)


@mx.compile
def _gated_rms_norm(x: mx.array, gate: mx.array, weight: mx.array, eps: float) -> mx.array:
    normed = mx.fast.rms_norm(x, weight, eps)
    return (nn.silu(gate.astype(mx.float32)) * normed.astype(mx.float32)).astype(x.dtype)


class GatedRMSNorm(nn.Module):
    """RMS norm over each head's values, scaled, then multiplied by silu(gate) (in float32)."""

    def __init__(self, dims: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = mx.ones((dims,))

    def __call__(self, x: mx.array, gate: mx.array) -> mx.array:
        return _gated_rms_norm(x, gate, self["weight"], self.eps)


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet linear attention; this class reads Qwen3-Next's packed projections (see `project`)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.key_heads, self.value_heads = args.linear_num_key_heads, args.linear_num_value_heads
        self.key_head_dim, self.value_head_dim = args.linear_key_head_dim, args.linear_value_head_dim
        if self.value_heads % self.key_heads:
            raise ValueError(f"{self.value_heads} value heads cannot share {self.key_heads} key heads evenly")
        self.key_dim = self.key_heads * self.key_head_dim
        self.value_dim = self.value_heads * self.value_head_dim
        conv_channels = 2 * self.key_dim + self.value_dim
        self.make_projections(args.hidden_size)
        self.conv1d = ShortConv(conv_channels, args.linear_conv_kernel_dim, bias=False)
        self.dt_bias = mx.zeros((self.value_heads,))
        self.A_log = mx.zeros((self.value_heads,))
        self.norm = GatedRMSNorm(self.value_head_dim, args.rms_norm_eps)
        self.out_proj = Linear(self.value_dim, args.hidden_size)

    def make_projections(self, dims: int) -> None:
        self.in_proj_qkvz = Linear(dims, 2 * self.key_dim + 2 * self.value_dim)
        self.in_proj_ba = Linear(dims, 2 * self.value_heads)

    def project(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array, mx.array]:
        """(q, k, v concatenated as the convolution takes them, z, b, a) from x.

        The packed projections group their outputs by key head: per key head,
        its query, its key, then the values and the output gates of the value
        heads that share it; likewise b then a.
        """
        batch, length, _ = x.shape
        shared = self.value_heads // self.key_heads
        packed = self.in_proj_qkvz(x).reshape(batch, length, self.key_heads, -1)
        split = [self.key_head_dim, 2 * self.key_head_dim, 2 * self.key_head_dim + shared * self.value_head_dim]
        q, k, v, z = mx.split(packed, split, axis=-1)
        b, a = mx.split(self.in_proj_ba(x).reshape(batch, length, self.key_heads, -1), [shared], axis=-1)
        qkv = mx.concatenate([t.reshape(batch, length, -1) for t in (q, k, v)], axis=-1)
        per_head = (batch, length, self.value_heads)
        return qkv, z.reshape(*per_head, self.value_head_dim), b.reshape(per_head), a.reshape(per_head)

    def __call__(self, x: mx.array, cache: RecurrentCache | None) -> mx.array:
        batch, length, _ = x.shape
        qkv, z, b, a = self.project(x)
        conv_out, window = self.conv1d(qkv, None if cache is None else cache.conv)
        q, k, v = mx.split(conv_out, [self.key_dim, 2 * self.key_dim], axis=-1)
        q, k = normalize_qk(q.reshape(batch, length, self.key_heads, -1), k.reshape(batch, length, self.key_heads, -1))
        decay, beta = gates(a, b, self["A_log"], self["dt_bias"])
        v = v.reshape(batch, length, self.value_heads, -1)
        y, state = gated_delta(q, k, v, decay, beta, None if cache is None else cache.recurrent)
        if cache is not None:
            cache.advance(window, state, length)
        return self.out_proj(self.norm(y, z).reshape(batch, length, -1))

    def shard(self, group: mx.distributed.Group) -> None:
        """By key heads, each with the value heads that share it: the packed projections group their rows by key
        head, so a share of their rows is a share of heads; the convolution's channels (all queries, then all
        keys, then all values) are shared out part by part, as are the per-value-head gates. Each rank's
        recurrent state holds only its heads."""
        key_dim, value_dim = self.key_dim, self.value_dim
        self.shard_projections(group)
        self.conv1d.weight = part(self.conv1d.weight, group, segments=[key_dim, 2 * key_dim])
        self.dt_bias, self.A_log = part(self["dt_bias"], group), part(self["A_log"], group)
        split_inputs(self.out_proj, group)
        self.key_heads = share(self.key_heads, group, "linear-attention key heads")
        self.value_heads = share(self.value_heads, group, "linear-attention value heads")
        self.key_dim, self.value_dim = key_dim // group.size(), value_dim // group.size()

    def shard_projections(self, group: mx.distributed.Group) -> None:
        split_outputs(self.in_proj_qkvz, group)
        split_outputs(self.in_proj_ba, group)


class SharedExpertMoeBlock(qwen3_moe.SparseMoeBlock):
    """Qwen3-MoE's routed experts plus one shared SwiGLU expert, weighted by sigmoid(shared_expert_gate(x))."""

    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.shared_expert = GatedMLP(args.hidden_size, args.shared_expert_intermediate_size)
        self.shared_expert_gate = Linear(args.hidden_size, 1)

    def __call__(self, x: mx.array) -> mx.array:
        return super().__call__(x) + mx.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)

    def shard(self, group: mx.distributed.Group) -> None:
        """The shared expert's gate stays whole: each rank's part of the shared expert is weighted as the whole."""
        super().shard(group)
        self.shared_expert.shard(group)


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, mixer: GatedDeltaNet | GatedAttention, sparse: bool):
        super().__init__()
        self.is_linear = isinstance(mixer, GatedDeltaNet)
        if self.is_linear:
            self.linear_attn = mixer
        else:
            self.self_attn = mixer
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        if sparse:
            self.mlp = SharedExpertMoeBlock(args)
        else:
            self.mlp = GatedMLP(args.hidden_size, args.intermediate_size)

    def __call__(self, x: mx.array, cache: Cache | None, position: int | mx.array | None = None) -> mx.array:
        """`position`: what full attention's rotary embedding takes (its cache's offset when None)."""
        normed = self.input_layernorm(x)
        h = x + (self.linear_attn(normed, cache) if self.is_linear else self.self_attn(normed, cache, position))
        return h + self.mlp(self.post_attention_layernorm(h))


class MultiTokenPredictor(nn.Module):
    """The checkpoint's multi-token-prediction head (`mtp.*`), as vLLM and SGLang run Qwen3-Next's and Qwen3.5's:
    the embedding of the token at t + 1 and the model's final (normed) hidden state at t, each RMS-normed
    (`pre_fc_norm_embedding`, `pre_fc_norm_hidden`), side by side in that order, projected back to the hidden size
    (`fc`), through a full-attention decoder layer like the model's (its feed-forward sparse as the model's first
    layer's is) and a final norm: the hidden state whose logits, through the model's own output head, are those
    of the token at t + 2. It shares the model's embedding and output head, which it has none of."""

    def __init__(self, args: ModelArgs, attention: type[GatedAttention]):
        super().__init__()
        self.pre_fc_norm_embedding = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.fc = Linear(2 * args.hidden_size, args.hidden_size)
        self.layers = [DecoderLayer(args, attention(args), args.is_sparse(0)) for _ in range(args.mtp_layers)]
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def __call__(self, hidden: mx.array, embedded: mx.array, cache: list[KVCache] | None,
                 position: int | mx.array | None = None) -> mx.array:
        joined = mx.concatenate([self.pre_fc_norm_embedding(embedded), self.pre_fc_norm_hidden(hidden)], axis=-1)
        h = self.fc(joined)
        for layer, layer_cache in zip(self.layers, cache or [None] * len(self.layers), strict=True):
            h = layer(h, layer_cache, position)
        return self.norm(h)

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]


class Model(LanguageModel):
    linear_attention = GatedDeltaNet
    attention = GatedAttention

    def __init__(self, args: ModelArgs):
        layers = [DecoderLayer(args, (self.linear_attention if args.is_linear(i) else self.attention)(args),
                               args.is_sparse(i)) for i in range(args.num_hidden_layers)]
        super().__init__(args, qwen3.Decoder(args, layers))
        # vLLM runs a head of several layers one layer per draft; no checkpoint has more than one.
        if args.mtp_layers == 1:
            self.mtp = MultiTokenPredictor(args, self.attention)

    def __call__(self, tokens: mx.array, cache: list[Cache] | None = None, return_hidden: bool = False
                 ) -> mx.array | tuple[mx.array, mx.array]:
        """(batch, length) int32 token ids -> (batch, length, vocab) logits, advancing `cache` when given; with
        `return_hidden`, (logits, the final hidden states they come from)."""
        hidden = self.model(tokens, cache if cache is not None else [None] * self.args.num_hidden_layers)
        return (self.logits(hidden), hidden) if return_hidden else self.logits(hidden)

    def drafter(self) -> MTPDrafter | None:
        """The checkpoint's multi-token-prediction head as a drafter (plugd.nn.mtp); None without one."""
        return HeadDrafter(self.mtp, self.model.embed_tokens, self.logits) if "mtp" in self else None

    @property
    def quant_predicate(self):
        return routers_at_8_bits("mlp.gate", "mlp.shared_expert_gate")

    def make_cache(self) -> list[Cache]:
        """Per layer: a recurrent cache for linear attention, keys and values for full attention."""
        return [RecurrentCache() if self.args.is_linear(i) else KVCache() for i in range(self.args.num_hidden_layers)]

    def shard(self, group: mx.distributed.Group) -> None:
        """Tensor parallel: both attentions by heads, feed-forward blocks by hidden units (plugd.nn.sharding)."""
        shard_blocks(self.model.layers, group, "self_attn", "linear_attn", "mlp")

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Fold a Hugging Face (or MLX-converted) checkpoint into this model's parameters, lazily.

        The multi-token-prediction head (`mtp.*`) is kept where the model has one, which it drops when the
        checkpoint does not carry it (mlx-lm's conversions leave it out); a head the model has no place for is
        dropped. A checkpoint whose convolution kernels are still in the Hugging Face layout has not been
        converted, so its zero-centred norm weights get their 1 back. Experts are stacked, from per-expert
        tensors or from fused 3-D ones.
        """
        if not any(name.startswith(MTP) for name in weights):
            self.pop("mtp", None)
        if "mtp" not in self:
            weights = {name: tensor for name, tensor in weights.items() if not name.startswith(MTP)}
        if fold_conv_weights(weights):
            for name, tensor in weights.items():
                if name.endswith(ZERO_CENTRED_NORMS):
                    weights[name] = tensor + 1.0
        prefixes = [f"model.layers.{layer}.mlp" for layer in range(self.args.num_hidden_layers)
                    if self.args.is_sparse(layer)]
        if "mtp" in self and self.args.is_sparse(0):
            prefixes += [f"{MTP}layers.{layer}.mlp" for layer in range(self.args.mtp_layers)]
        for prefix in prefixes:
            stack_fused_experts(weights, prefix)
            stack_experts(weights, prefix, self.args.num_experts)
        return super().sanitize(weights)


def stack_fused_experts(weights: dict[str, mx.array], prefix: str) -> None:
    """transformers 5's fused expert tensors, `experts.gate_up_proj` (experts, 2 * hidden, dims) and
    `experts.down_proj`, as the stacked `switch_mlp.{gate,up,down}_proj.weight` (lazily; absent: nothing)."""
    gate_up = weights.pop(f"{prefix}.experts.gate_up_proj", None)
    if gate_up is None:
        return
    gate, up = mx.split(gate_up, 2, axis=-2)
    weights[f"{prefix}.switch_mlp.gate_proj.weight"] = gate
    weights[f"{prefix}.switch_mlp.up_proj.weight"] = up
    weights[f"{prefix}.switch_mlp.down_proj.weight"] = weights.pop(f"{prefix}.experts.down_proj")
