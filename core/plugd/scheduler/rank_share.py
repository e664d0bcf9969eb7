"""What this machine, rank 0 of a runner group, holds of a model split across the group: worked out from the
checkpoint's tensor names and sizes, since the daemon imports no MLX and no architecture.

A decoder's layers are the tensors named `<prefix>layers.<i>.` (or Ollama's `blk.<i>.`) under the prefix that
holds the most bytes, so that a vision tower's own layers are not taken for them. Everything else (embeddings,
output head, final norm, vision tower) stays whole on every rank, whatever the split.

- tensor: each rank keeps a share of every layer's matrices but its MoE router (a module named `gate` or
  `router`, as checkpoints name them); its one-dimensional tensors (norms, per-head gates) are counted whole,
  although some split.
- pipeline: rank 0 holds the first stage's layers whole (plugd.protocol.stage_layers), none of the others.
- undecided (the architecture's declaration, which only the runner reads, decides): the larger of the two.

Caches follow the layers: a share of every layer's heads, or the first stage's layers' caches, assumed alike
from layer to layer.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

from attrs import frozen

from plugd.protocol import PIPELINE, TENSOR, stage_layers
from plugd.scheduler.memory import tensor_bytes

LAYER = re.compile(r"^(.*?)(?:layers|blk)\.(\d+)\.")
ROUTER = re.compile(r"\.(?:gate|router|shared_expert_gate)\.")


@frozen
class RankShare:
    weights: int  # bytes of the weights rank 0 holds
    caches: float  # the part of the model's caches it holds


def rank_share(tensors: dict[str, dict[str, Any]], float_bytes: int, ranks: int, split: str | None,
               dropped: tuple[str, ...] = ()) -> RankShare:
    """What rank 0 holds of a model of `tensors` (name -> dtype and shape) split across `ranks` as `split` says
    (TENSOR, PIPELINE, or None where the daemon cannot tell which); tensors named with a `dropped` prefix (a
    multi-token-prediction head's: Architecture.drafter_tensors) are not loaded at all."""
    tensors = {name: tensor for name, tensor in tensors.items() if not name.startswith(dropped)}
    layers = _decoder_layers(tensors)
    whole = sum(tensor_bytes(t, float_bytes) for name, t in tensors.items() if name not in layers)
    count = max(layers.values(), default=-1) + 1
    if count == 0:
        return RankShare(whole, 1.0)
    stage = stage_layers(count, ranks, 0)
    by_layers = whole + sum(tensor_bytes(tensors[name], float_bytes) for name, layer in layers.items()
                            if layer in stage)
    by_tensors = whole + sum(tensor_bytes(tensors[name], float_bytes) if _whole_in_each(name, tensors[name])
                             else -(-tensor_bytes(tensors[name], float_bytes) // ranks) for name in layers)
    shares = {TENSOR: RankShare(by_tensors, 1 / ranks), PIPELINE: RankShare(by_layers, len(stage) / count)}
    if split is not None:
        return shares[split]
    return RankShare(max(by_tensors, by_layers), max(1 / ranks, len(stage) / count))


def _whole_in_each(name: str, tensor: dict[str, Any]) -> bool:
    """Whether tensor parallelism keeps a layer's tensor whole on every rank (or may: counted so)."""
    return len(tensor["shape"]) < 2 or ROUTER.search(name) is not None


def _decoder_layers(tensors: dict[str, dict[str, Any]]) -> dict[str, int]:
    """The decoder's layer tensors, name -> layer index: those under the layer prefix that holds the most."""
    found = {name: (match[1], int(match[2])) for name in tensors if (match := LAYER.match(name))}
    held: dict[str, int] = defaultdict(int)
    for name, (prefix, _) in found.items():
        held[prefix] += math.prod(tensors[name]["shape"])
    if not held:
        return {}
    decoder = max(held, key=held.__getitem__)
    return {name: layer for name, (prefix, layer) in found.items() if prefix == decoder}
