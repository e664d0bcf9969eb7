"""Qwen3-MoE, config.json model_type "qwen3_moe": Qwen3 whose feed-forward is, on sparse layers,
a softmax router over experts with the top-k experts' SwiGLU outputs mixed by router weight.

Checkpoints keep one tensor per expert (`mlp.experts.{e}.gate_proj.weight`);
`sanitize` stacks them into `mlp.switch_mlp.*` as MLX-converted checkpoints hold them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from plugd.nn.linear import Linear
from plugd.nn.switch import routers_at_8_bits, stack_experts
from plugd.nn.switch_mlp import SwitchGLU
from plugd_qwen import qwen3


@dataclass(frozen=True)
class ModelArgs(qwen3.ModelArgs):
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    decoder_sparse_step: int
    mlp_only_layers: tuple[int, ...]
    norm_topk_prob: bool

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> ModelArgs:
        return cls(
            **qwen3.dense_fields(config),
            # transformers 5 renamed num_experts to num_local_experts.
            num_experts=config["num_experts"] if "num_experts" in config else config["num_local_experts"],
            num_experts_per_tok=config["num_experts_per_tok"],
            moe_intermediate_size=config["moe_intermediate_size"],
            decoder_sparse_step=config.get("decoder_sparse_step", 1),
            mlp_only_layers=tuple(config.get("mlp_only_layers", ())),
            norm_topk_prob=config.get("norm_topk_prob", False),
        )

    def is_sparse(self, layer: int) -> bool:
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )


class SparseMoeBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.top_k = args.num_experts_per_tok
        self.norm_topk_prob = args.norm_topk_prob
        self.gate = Linear(args.hidden_size, args.num_experts)
        self.switch_mlp = SwitchGLU(args.hidden_size, args.moe_intermediate_size, args.num_experts)

    def __call__(self, x: mx.array) -> mx.array:
        probs = mx.softmax(self.gate(x), axis=-1, precise=True)
        # Expert choice is discrete: no gradient flows through it (plugd.testing trains tiny MoE checkpoints).
        experts = mx.stop_gradient(mx.argpartition(probs, kth=-self.top_k, axis=-1)[..., -self.top_k :])
        weights = mx.take_along_axis(probs, experts, axis=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(axis=-1, keepdims=True)
        return (self.switch_mlp(x, experts) * weights[..., None]).sum(axis=-2)

    def shard(self, group: mx.distributed.Group) -> None:
        """The router stays whole, so every rank picks the same experts and runs its share of each."""
        self.switch_mlp.shard(group)


class Model(qwen3.Model):
    args: ModelArgs

    @property
    def quant_predicate(self):
        return routers_at_8_bits("mlp.gate")

    def feed_forward(self, args: ModelArgs, layer: int) -> nn.Module:
        return SparseMoeBlock(args) if args.is_sparse(layer) else super().feed_forward(args, layer)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        weights = super().sanitize(weights)
        for layer in range(self.args.num_hidden_layers):
            if self.args.is_sparse(layer):
                stack_experts(weights, f"model.layers.{layer}.mlp", self.args.num_experts)
        return weights
