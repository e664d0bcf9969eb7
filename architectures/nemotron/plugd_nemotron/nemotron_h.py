"""Nemotron-H, config.json model_type "nemotron_h": a hybrid stack of Mamba2 mixers, attention (without
positional encoding), relu^2 MLPs and relu^2 mixtures of experts, one kind per layer, each a pre-norm
residual block.

The layer kinds come from `hybrid_override_pattern` ("M" Mamba2, "*" attention,
"-" MLP, "E" MoE), or in configs written by transformers 5 from
`layers_block_type` / `layer_types` ("linear_attention", "full_attention",
"mlp", "moe", and the older "mamba", "attention"). Parameter names follow the
Hugging Face checkpoint (`backbone.layers.{i}.mixer...`), with the experts
stacked as MLX-converted checkpoints hold them (`mixer.switch_mlp.fc1.weight`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from plugd.nn.attention import attend
from plugd.nn.cache import KVCache
from plugd.nn.linear import Embedding, Linear
from plugd.nn.mamba import selective_scan, time_steps
from plugd.nn.media import place_media
from plugd.nn.norms import RMSNorm
from plugd.nn.pipeline import PipelineLayers
from plugd.nn.recurrent import RecurrentCache
from plugd.nn.sharding import part, shard_attention, shard_blocks, share, split_inputs, split_outputs
from plugd.nn.short_conv import ShortConv, fold_conv_weights
from plugd.nn.switch import stack_experts
from plugd.nn.switch_mlp import SwitchMLP
from plugd_nemotron.config import ATTENTION, BIASES, MAMBA, MLP, MOE, block_pattern, number, read

CACHED = (MAMBA, ATTENTION)  # the kinds of block that keep a cache


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    hidden_size: int
    pattern: str
    layer_norm_epsilon: float
    tie_word_embeddings: bool
    # attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    # Mamba2
    mamba_num_heads: int
    mamba_head_dim: int
    ssm_state_size: int
    n_groups: int
    conv_kernel: int
    use_conv_bias: bool
    time_step_limit: tuple[float, float]
    # MLP and MoE
    intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    moe_shared_expert_intermediate_size: int
    n_shared_experts: int
    moe_latent_size: int | None
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> ModelArgs:
        if biased := [key for key in BIASES if config.get(key)]:
            raise ValueError(f"{', '.join(biased)}: linear layers with biases are not supported")
        heads = config["num_attention_heads"]
        pattern = block_pattern(config)
        moe = MOE in pattern
        low, high = read(config, "time_step_limit") or (0.0, math.inf)
        return cls(
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            pattern=pattern,
            layer_norm_epsilon=config.get("layer_norm_epsilon", 1e-5),
            tie_word_embeddings=config.get("tie_word_embeddings", False),
            num_attention_heads=heads,
            num_key_value_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            mamba_num_heads=config["mamba_num_heads"],
            mamba_head_dim=config["mamba_head_dim"],
            ssm_state_size=config["ssm_state_size"],
            n_groups=read(config, "n_groups", 8),
            conv_kernel=read(config, "conv_kernel", 4),
            use_conv_bias=read(config, "use_conv_bias", True),
            time_step_limit=(number(low), number(high)),
            intermediate_size=config.get("intermediate_size", 0),
            # transformers 5 may write num_local_experts for n_routed_experts.
            n_routed_experts=config.get("n_routed_experts", config.get("num_local_experts", 0)) if moe else 0,
            num_experts_per_tok=config.get("num_experts_per_tok", 0),
            moe_intermediate_size=config.get("moe_intermediate_size", 0),
            moe_shared_expert_intermediate_size=config.get("moe_shared_expert_intermediate_size", 0),
            n_shared_experts=config.get("n_shared_experts", 1),
            moe_latent_size=config.get("moe_latent_size"),
            n_group=config.get("n_group", 1),
            topk_group=config.get("topk_group", 1),
            norm_topk_prob=config.get("norm_topk_prob", True),
            routed_scaling_factor=float(config.get("routed_scaling_factor", 1.0)),
        )


@mx.compile
def _gated_group_norm(x: mx.array, gate: mx.array, weight: mx.array, groups: int, eps: float) -> mx.array:
    x = x * nn.silu(gate)
    normed = mx.fast.rms_norm(x.reshape(*x.shape[:-1], groups, -1), None, eps)
    return weight * normed.reshape(x.shape)


class GatedGroupRMSNorm(nn.Module):
    """silu(gate) * x, RMS-normalised within each of `groups` equal slices of the features, then scaled."""

    def __init__(self, dims: int, groups: int, eps: float):
        super().__init__()
        self.groups, self.eps = groups, eps
        self.weight = mx.ones((dims,))

    def __call__(self, x: mx.array, gate: mx.array) -> mx.array:
        return _gated_group_norm(x, gate, self["weight"], self.groups, self.eps)


class Mamba2Mixer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.heads, self.head_dim = args.mamba_num_heads, args.mamba_head_dim
        self.groups, self.state_size = args.n_groups, args.ssm_state_size
        self.inner = self.heads * self.head_dim
        self.conv_channels = self.inner + 2 * self.groups * self.state_size
        self.time_step_limit = args.time_step_limit
        self.in_proj = Linear(args.hidden_size, self.inner + self.conv_channels + self.heads)
        self.conv1d = ShortConv(self.conv_channels, args.conv_kernel, args.use_conv_bias)
        self.dt_bias = mx.zeros((self.heads,))
        self.A_log = mx.zeros((self.heads,))
        self.D = mx.zeros((self.heads,))
        self.norm = GatedGroupRMSNorm(self.inner, self.groups, args.layer_norm_epsilon)
        self.out_proj = Linear(self.inner, args.hidden_size)

    def __call__(self, x: mx.array, cache: RecurrentCache | None) -> mx.array:
        batch, length, _ = x.shape
        gate, conv_input, dt = mx.split(self.in_proj(x), [self.inner, self.inner + self.conv_channels], axis=-1)
        conv_out, window = self.conv1d(conv_input, None if cache is None else cache.conv)
        xs, B, C = mx.split(conv_out, [self.inner, self.inner + self.groups * self.state_size], axis=-1)
        y, state = selective_scan(
            xs.reshape(batch, length, self.heads, self.head_dim),
            time_steps(dt, self["dt_bias"], *self.time_step_limit),
            -mx.exp(self["A_log"].astype(mx.float32)),
            B.reshape(batch, length, self.groups, self.state_size),
            C.reshape(batch, length, self.groups, self.state_size),
            self["D"],
            None if cache is None else cache.recurrent,
        )
        if cache is not None:
            cache.advance(window, state, length)
        return self.out_proj(self.norm(y.reshape(batch, length, self.inner), gate))

    def shard(self, group: mx.distributed.Group) -> None:
        """By heads, each group of heads with its B and C: in_proj's gate, x, B, C and dt rows are shared out
        part by part, as are the convolution's x, B and C channels and the per-head vectors; the gated norm
        keeps its groups whole. Each rank's recurrent state holds only its heads."""
        inner, grouped = self.inner, self.groups * self.state_size
        split_outputs(self.in_proj, group, segments=[inner, 2 * inner, 2 * inner + grouped, 2 * inner + 2 * grouped])
        channels = [inner, inner + grouped]
        self.conv1d.weight = part(self.conv1d["weight"], group, channels)
        if "bias" in self.conv1d:
            self.conv1d.bias = part(self.conv1d["bias"], group, channels)
        self.dt_bias, self.A_log, self.D = (part(self[name], group) for name in ("dt_bias", "A_log", "D"))
        self.norm.weight = part(self.norm["weight"], group)
        split_inputs(self.out_proj, group)
        self.heads = share(self.heads, group, "Mamba heads")
        self.groups = self.norm.groups = share(self.groups, group, "Mamba groups")
        self.inner, self.conv_channels = inner // group.size(), self.conv_channels // group.size()


class Attention(nn.Module):
    """Grouped-query attention without positional encoding (the Mamba2 layers carry position)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.heads, self.kv_heads, head_dim = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        self.scale = head_dim**-0.5
        self.q_proj = Linear(args.hidden_size, self.heads * head_dim)
        self.k_proj = Linear(args.hidden_size, self.kv_heads * head_dim)
        self.v_proj = Linear(args.hidden_size, self.kv_heads * head_dim)
        self.o_proj = Linear(self.heads * head_dim, args.hidden_size)

    def __call__(self, x: mx.array, cache: KVCache | None) -> mx.array:
        batch, length, _ = x.shape

        def heads_first(y: mx.array, heads: int) -> mx.array:
            return y.reshape(batch, length, heads, -1).transpose(0, 2, 1, 3)

        queries = heads_first(self.q_proj(x), self.heads)
        keys, values = heads_first(self.k_proj(x), self.kv_heads), heads_first(self.v_proj(x), self.kv_heads)
        if cache is not None:
            keys, values = cache.update_and_fetch(keys, values)
        out = attend(queries, keys, values, self.scale, cache)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(batch, length, -1))

    def shard(self, group: mx.distributed.Group) -> None:
        shard_attention(self, group)


class ReluSquaredMLP(nn.Module):
    """down(relu(up(x))^2)."""

    def __init__(self, dims: int, hidden_dims: int):
        super().__init__()
        self.up_proj = Linear(dims, hidden_dims)
        self.down_proj = Linear(hidden_dims, dims)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.relu2(self.up_proj(x)))

    def shard(self, group: mx.distributed.Group) -> None:
        split_outputs(self.up_proj, group)
        split_inputs(self.down_proj, group)


@mx.compile
def _route(logits, bias, top_k: int, n_group: int, topk_group: int, normalize: bool, scale: float):
    scores = mx.sigmoid(logits.astype(mx.float32))
    choice = scores + bias
    if n_group > topk_group:
        # Only experts in the topk_group groups with the best two-expert sums compete.
        grouped = mx.unflatten(choice, -1, (n_group, -1))
        group_scores = mx.topk(grouped, 2, axis=-1).sum(axis=-1, keepdims=True)
        dropped = mx.argpartition(group_scores, kth=n_group - topk_group - 1, axis=-2)[..., : n_group - topk_group, :]
        choice = mx.put_along_axis(grouped, dropped, mx.array(-mx.inf, choice.dtype), axis=-2).flatten(-2, -1)
    experts = mx.argpartition(-choice, kth=top_k - 1, axis=-1)[..., :top_k]
    weights = mx.take_along_axis(scores, experts, axis=-1)
    if normalize:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
    return experts, weights * scale


class Router(nn.Module):
    """Sigmoid scores; experts chosen on scores plus a per-expert correction bias (within the best groups),
    weighted by their plain scores, normalised to sum to one when configured, then scaled.

    Kept dense even in quantized checkpoints, as mlx-lm keeps it: it has no
    quantized twin.
    """

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.top_k, self.n_group, self.topk_group = args.num_experts_per_tok, args.n_group, args.topk_group
        self.normalize, self.scale = args.norm_topk_prob, args.routed_scaling_factor
        self.weight = mx.zeros((args.n_routed_experts, args.hidden_size))
        self.e_score_correction_bias = mx.zeros((args.n_routed_experts,))

    def __call__(self, x: mx.array) -> tuple[mx.array, mx.array]:
        logits = x @ self["weight"].T
        return _route(logits, self["e_score_correction_bias"], self.top_k, self.n_group, self.topk_group,
                      self.normalize, self.scale)


class MoE(nn.Module):
    """Routed relu^2 experts (optionally in a smaller latent space) plus shared relu^2 experts."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        expert_dims = args.moe_latent_size or args.hidden_size
        self.gate = Router(args)
        self.switch_mlp = SwitchMLP(expert_dims, args.moe_intermediate_size, args.n_routed_experts, nn.relu2)
        if args.moe_latent_size:
            self.fc1_latent_proj = Linear(args.hidden_size, args.moe_latent_size)
            self.fc2_latent_proj = Linear(args.moe_latent_size, args.hidden_size)
        if args.n_shared_experts:
            self.shared_experts = ReluSquaredMLP(args.hidden_size, args.moe_shared_expert_intermediate_size)

    def __call__(self, x: mx.array) -> mx.array:
        experts, weights = self.gate(x)
        routed_input = self.fc1_latent_proj(x) if "fc1_latent_proj" in self else x
        y = (self.switch_mlp(routed_input, experts) * weights[..., None]).sum(axis=-2).astype(x.dtype)
        if "fc2_latent_proj" in self:
            y = self.fc2_latent_proj(y)
        if "shared_experts" in self:
            y = y + self.shared_experts(x)
        return y

    def shard(self, group: mx.distributed.Group) -> None:
        """The router and the latent projections stay whole: fc2_latent_proj, linear, maps each rank's part of the
        experts' sum to its part of the output."""
        self.switch_mlp.shard(group)
        if "shared_experts" in self:
            self.shared_experts.shard(group)


class Block(nn.Module):
    def __init__(self, args: ModelArgs, kind: str):
        super().__init__()
        self.kind = kind
        self.norm = RMSNorm(args.hidden_size, args.layer_norm_epsilon)
        if kind == MAMBA:
            self.mixer = Mamba2Mixer(args)
        elif kind == ATTENTION:
            self.mixer = Attention(args)
        elif kind == MLP:
            self.mixer = ReluSquaredMLP(args.hidden_size, args.intermediate_size)
        else:
            self.mixer = MoE(args)

    def __call__(self, x: mx.array, cache: RecurrentCache | KVCache | None) -> mx.array:
        h = self.norm(x)
        return x + (self.mixer(h, cache) if self.kind in CACHED else self.mixer(h))


class Backbone(nn.Module):
    """The checkpoint's `backbone.` subtree: embeddings, blocks, final norm."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embeddings = Embedding(args.vocab_size, args.hidden_size)
        self.pattern = args.pattern
        self.layers = [Block(args, kind) for kind in args.pattern]
        self.norm_f = RMSNorm(args.hidden_size, args.layer_norm_epsilon)

    def __call__(self, tokens: mx.array, cache: list[RecurrentCache | KVCache] | None,
                 media: Sequence[tuple[int, mx.array]] = ()) -> mx.array:
        h = self.embeddings(tokens)
        if media:
            h = place_media(h, media)
        caches = iter(cache) if cache is not None else None
        for layer, kind in zip(self.layers, self.pattern, strict=True):
            h = layer(h, next(caches) if caches is not None and kind in CACHED else None)
        return self.norm_f(h)


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.backbone = Backbone(args)
        if not args.tie_word_embeddings:
            self.lm_head = Linear(args.hidden_size, args.vocab_size)

    def __call__(self, tokens: mx.array, cache: list[RecurrentCache | KVCache] | None = None,
                 media: Sequence[tuple[int, mx.array]] = ()) -> mx.array:
        """(batch, length) int32 token ids -> (batch, length, vocab) logits, advancing `cache` when given; `media`
        spans (start, (n, hidden) embeddings) take those embeddings instead of their tokens'."""
        h = self.backbone(tokens, cache, media)
        if self.args.tie_word_embeddings:
            return self.backbone.embeddings.as_linear(h)
        return self.lm_head(h)

    def make_cache(self) -> list[RecurrentCache | KVCache]:
        """One cache per Mamba2 layer (recurrent) and per attention layer (keys and values), in layer order;
        MLP and MoE layers keep nothing."""
        return [RecurrentCache() if kind == MAMBA else KVCache() for kind in self.args.pattern if kind in CACHED]

    def pipeline_layers(self) -> PipelineLayers:
        """The backbone's blocks; MLP and MoE blocks keep no cache."""
        cached = [kind in CACHED for kind in self.args.pattern]
        return PipelineLayers(self.backbone.layers, [sum(cached[:i]) if cached[i] else None
                                                     for i in range(len(cached))])

    def shard(self, group: mx.distributed.Group) -> None:
        """Tensor parallel (plugd.nn.sharding): every block's mixer (Mamba2, attention, MLP or MoE) by its own
        `shard`, summed over the group."""
        shard_blocks(self.backbone.layers, group, "mixer")

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Fold a Hugging Face checkpoint into this model's parameters, lazily.

        Multi-token-prediction weights (`mtp.*`) are dropped on purpose: plugd
        decodes one token per step and never runs those heads. Convolution
        weights move into MLX's layout; per-expert tensors are stacked (and
        transformers 5's fused 3-D expert tensors renamed); a transformers 5
        `model.` prefix reads as `backbone.`.
        """
        weights = {
            ("backbone." + name.removeprefix("model.")) if name.startswith("model.") else name: tensor
            for name, tensor in weights.items()
            if not name.startswith("mtp.")
        }
        fold_conv_weights(weights)
        for layer, kind in enumerate(self.args.pattern):
            if kind == MOE:
                self._stack_experts(weights, f"backbone.layers.{layer}.mixer")
        if self.args.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        return weights

    def _stack_experts(self, weights: dict[str, mx.array], prefix: str) -> None:
        stack_experts(weights, prefix, self.args.n_routed_experts)
        for theirs, ours in (("up_proj", "fc1"), ("down_proj", "fc2")):
            for stacked in (f"{prefix}.switch_mlp.{theirs}.weight", f"{prefix}.experts.{theirs}"):
                if stacked in weights:
                    weights[f"{prefix}.switch_mlp.{ours}.weight"] = weights.pop(stacked)
