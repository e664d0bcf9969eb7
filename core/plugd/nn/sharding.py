"""Tensor parallelism: a model's blocks split across the ranks of an MLX distributed group, in place.

An architecture declares how its model splits with a `shard(group)` method
(docs/plugins.md). Inside a block, a layer whose outputs are split
(`split_outputs`: each rank keeps its share of the output features, so of the
attention heads or of the MLP's hidden units) feeds a layer whose inputs are
split the same way (`split_inputs`). Each rank's output of that second layer is
a partial sum, and `Summed` adds them up over the group, once per block.
Embeddings, norms, routers and the output head stay whole on every rank.

Splitting runs before the load's one evaluation (plugd.runner.loading): each
split is a lazy slice, so a rank keeps only its share of each tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import shard_inplace


def split_outputs(layer: nn.Module, group: mx.distributed.Group, segments: int | Sequence[int] = 1) -> None:
    """Keep this rank's share of `layer`'s output features (dense, quantized or per-expert weights alike).
    `segments` (a count, or indices) marks a fused weight's parts, each shared out on its own."""
    shard_inplace(layer, "all-to-sharded", segments=list(segments) if not isinstance(segments, int) else segments,
                  group=group)


def split_inputs(layer: nn.Module, group: mx.distributed.Group) -> None:
    """Keep this rank's share of `layer`'s input features: its output becomes this rank's part of a sum. A
    quantized layer's share must hold whole quantization groups (ValueError otherwise)."""
    if group_size := getattr(layer, "group_size", None):
        inputs = layer["scales"].shape[-1] * group_size
        if inputs % (group.size() * group_size):
            raise ValueError(f"{inputs} inputs quantized in groups of {group_size} do not split into whole groups "
                             f"across {group.size()} ranks")
    shard_inplace(layer, "sharded-to-all", group=group)


def part(array: mx.array, group: mx.distributed.Group, segments: Sequence[int] = ()) -> mx.array:
    """This rank's share of `array` along its first axis; with `segments` (indices), of each part between them."""
    pieces = mx.split(array, list(segments), axis=0) if segments else [array]
    return mx.contiguous(mx.concatenate([mx.split(p, group.size(), axis=0)[group.rank()] for p in pieces]))


def share(count: int, group: mx.distributed.Group, what: str) -> int:
    """This rank's share of `count` `what` (heads, say); ValueError when they do not split evenly."""
    if count % group.size():
        raise ValueError(f"{count} {what} do not split evenly across {group.size()} ranks")
    return count // group.size()


def shard_attention(attention: nn.Module, group: mx.distributed.Group) -> None:
    """Split an attention block that names its head counts `heads` and `kv_heads` and its projections q_proj,
    k_proj, v_proj and o_proj: each rank keeps a share of the query and key/value heads (its caches hold only
    those), and o_proj's output is its part of the sum."""
    attention.heads = share(attention.heads, group, "attention heads")
    attention.kv_heads = share(attention.kv_heads, group, "key/value heads")
    for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
        split_outputs(projection, group)
    split_inputs(attention.o_proj, group)


class Summed(nn.Module):
    """A split block: each rank computes its part of the output, and every rank gets their sum. A block that
    returns a tuple has its first item summed; the rest (keys and values a later layer shares, say) stay
    this rank's."""

    def __init__(self, block: nn.Module, group: mx.distributed.Group):
        super().__init__()
        self.block = block
        self.group = group

    def __call__(self, *args: Any, **kwargs: Any) -> mx.array | tuple:
        out = self.block(*args, **kwargs)
        if isinstance(out, tuple):
            return mx.distributed.all_sum(out[0], group=self.group), *out[1:]
        return mx.distributed.all_sum(out, group=self.group)


def shard_blocks(layers: Sequence[nn.Module], group: mx.distributed.Group, *names: str) -> None:
    """Split each block called one of `names` in each layer (by the block's own `shard`), and sum its output."""
    for layer in layers:
        for name in names:
            if name in layer:
                block = layer[name]
                block.shard(group)
                setattr(layer, name, Summed(block, group))
