"""Pipeline parallelism: a model's layers split into consecutive stages, one per rank of an MLX distributed group.

Rank r runs the r-th stage (plugd.protocol.stage_layers: rank 0 the first
layers). Every other layer in the model's layer list is replaced by a stand-in
that passes the hidden states on as they are, so the architecture's own decoder
loop runs unchanged, and the replaced layers' tensors are dropped before the
load evaluates anything: they are never read from the checkpoint. Embeddings,
the final norm, the output head and any vision tower stay on every rank.

The hidden states cross from one stage to the next once per forward pass: the
last layer of a stage sends them on, the first layer of the next receives them
in place of what the stand-ins before it passed. After the last layer every
rank gathers the last stage's output, so that all compute the same logits.

What is evaluated decides what is sent: a prefill evaluates only its caches'
states, and a rank's own caches come before its send. So the caches of the
layers a rank stands in for (plugd.nn.passed_cache) hold, after its stage, a
dependency on what it sent; and a stage must have such a cache after it, or of
its own for what it receives (a refusal otherwise). Nothing but what depends on
what orders the transfers, which differs from rank to rank: two forward passes
evaluated together could pair one rank's transfer of the one with another's of
the other, so each pass is evaluated before the next, as the engine does.

Where the layers are: `Model.pipeline_layers()` where the architecture defines it (raising ValueError where the
model cannot split so), else `model.model.layers` with one cache per layer, in make_cache's order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from plugd.nn.passed_cache import BatchPassedCache, PassedCache
from plugd.protocol import stage_layers


@dataclass(frozen=True)
class PipelineLayers:
    """The model's list of layers, each called with the hidden states first and returning the new ones; for each
    layer, the index of its cache in the model's `make_cache()` list (None for a layer that keeps none)."""

    layers: list[nn.Module]
    caches: Sequence[int | None]


def pipeline_layers(model: nn.Module) -> PipelineLayers:
    """Where `model`'s layers are: its own say, or the decoder convention (plugd.nn.decoder.LanguageModel)."""
    if hasattr(model, "pipeline_layers"):
        return model.pipeline_layers()
    decoder = model.get("model")
    if not isinstance(decoder, nn.Module) or not isinstance(decoder.get("layers"), list):
        raise ValueError("its layers are not at model.model.layers, and it has no pipeline_layers() to say where")
    return PipelineLayers(decoder.layers, range(len(decoder.layers)))


def split_layers(model: nn.Module, group: mx.distributed.Group) -> range:
    """Keep this rank's stage of `model`'s layers and stand in for the others, in place; return the stage.
    ValueError where the model does not split so."""
    where = pipeline_layers(model)
    layers, caches = where.layers, list(where.caches)
    make_cache = model.make_cache
    if len(caches) != len(layers) or not {i for i in caches if i is not None} <= set(range(len(make_cache()))):
        raise ValueError("its pipeline_layers() do not match its layers and caches")
    rank, last = group.rank(), group.size() - 1
    stage = stage_layers(len(layers), group.size(), rank)
    if not stage:
        raise ValueError(f"{len(layers)} layers do not make {group.size()} stages")
    _check_transfers(stage, caches, rank, last)
    for i, layer in enumerate(layers):
        edges = {"receive_from": rank - 1 if i == stage.start and rank > 0 else None,
                 "send_to": rank + 1 if i == stage.stop - 1 and rank < last else None,
                 "gather_from": last if i == len(layers) - 1 else None}
        if i not in stage:
            layers[i] = Stage(None, group, after=i >= stage.stop, gather_from=edges["gather_from"])
        elif any(edge is not None for edge in edges.values()):
            layers[i] = Stage(layer, group, **edges)
    stood_in = [caches[i] for i in range(len(layers)) if i not in stage and caches[i] is not None]

    def staged_caches() -> list[Any]:
        made = make_cache()
        for index in stood_in:
            made[index] = PassedCache()
        return made

    model.make_cache = staged_caches  # an attribute of this model, found before its class's method
    return stage


def _check_transfers(stage: range, caches: Sequence[int | None], rank: int, last: int) -> None:
    """A prefill evaluates only caches: what this rank sends must reach one after its stage, and what it receives
    one of its own or that one."""
    after = any(index is not None for index in caches[stage.stop:])
    own = any(caches[i] is not None for i in stage)
    if (rank < last and not after) or (rank > 0 and not (own or after)):
        raise ValueError(f"layers {stage.start} to {stage.stop - 1} and those after them keep no caches, which a "
                         "pipeline stage needs to pass its hidden states on")


class Stage(nn.Module):
    """A layer of this rank's stage (`layer`), or a stand-in for another rank's (None), and the hidden states'
    transfers at the stage's edges: received before the layer, sent on after it, gathered from the last stage
    after the model's last layer. A stand-in `after` this rank's stage makes its cache depend on what was sent."""

    def __init__(self, layer: nn.Module | None, group: mx.distributed.Group, receive_from: int | None = None,
                 send_to: int | None = None, gather_from: int | None = None, after: bool = False):
        super().__init__()
        self.layer = layer
        self.group = group
        self.receive_from, self.send_to, self.gather_from, self.after = receive_from, send_to, gather_from, after

    def __call__(self, hidden: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        if self.receive_from is not None:
            hidden = mx.distributed.recv_like(hidden, self.receive_from, group=self.group)
        if self.layer is not None:
            hidden = self._run(hidden, *args, **kwargs)
        else:
            for cache in (*args, *kwargs.values()):
                if isinstance(cache, PassedCache | BatchPassedCache):
                    cache.passed(hidden, sent=self.after)
        if self.send_to is not None:
            hidden = mx.distributed.send(hidden, self.send_to, group=self.group)
        if self.gather_from is not None:
            rows = hidden.shape[0]
            hidden = mx.distributed.all_gather(hidden, group=self.group)[self.gather_from * rows:][:rows]
        return hidden

    def _run(self, hidden: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        out = self.layer(hidden, *args, **kwargs)
        if not isinstance(out, mx.array) or out.shape != hidden.shape or out.dtype != hidden.dtype:
            raise ValueError("a pipeline passes each layer's hidden states to the next as they came in; this "
                             "layer returns something else")
        return out
