"""The built-in cache policy, single-slot, and how the runner makes the policy a CachePolicy descriptor names.

The contract every policy meets is in plugd.runner_api.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import mlx.nn as nn

from plugd.constants import SNAPSHOT_LIMIT
from plugd.nn.cache import snapshot_arrays
from plugd.runner_api import LiveCache, RunnerCachePolicy, common_prefix

# Where the single-slot policy snapshots the layers that cannot trim back (recurrent, sliding-window).
SNAPSHOT_INTERVAL = 1024  # along the live path, every this many tokens
SNAPSHOTS_BEFORE_END = (256, 64, 16)  # this far before each prompt's end, where an agent's next prompt departs


class SingleSlotPolicy(LiveCache):
    """The built-in policy: keep the last completion's live caches and reuse their longest common prefix.

    Layers whose caches span (plain KV) trim back to any position. The others (a recurrent state, a sliding
    window that dropped its oldest keys) cannot, so the policy snapshots them along the live path, at capture
    points the prefill stops at: every `interval` tokens, a few positions before the prompt's end (an agent's
    next prompt typically keeps the transcript and replaces what followed it) and at the prompt's end (the same
    prompt again). A prompt that departs from the live path resumes from the latest position at or before the
    departure that every layer can reach: trimmed back, or restored from a snapshot there. A snapshot (the cache
    protocol's, plugd.nn.cache) of a recurrent state copies nothing, one of a sliding window copies the window;
    at most `limit` are kept: when there are more, the older ones are thinned where they lie closest together.
    `stats()` counts them ("nodes") and the bytes they hold.
    """

    def __init__(self, model: nn.Module, interval: int = SNAPSHOT_INTERVAL, limit: int = SNAPSHOT_LIMIT):
        self.interval, self.limit = interval, limit
        self._snapshots: dict[int, list[Any]] = {}  # offset -> each layer's state there (None for plain KV layers)
        self._wanted: set[int] = set()  # offsets the current prefill stops at to snapshot, those not reached
        self._stats = {"bytes": 0, "nodes": 0}
        super().__init__(model)
        self._kept_whole = [not layer.spans for layer in self.layers]

    def reset(self) -> None:
        super().reset()
        self._snapshots.clear()
        self._count()

    def resume(self, prompt: Sequence[int]) -> int:
        keep = common_prefix(self.tokens, prompt[:-1])
        point = self._restore_point(keep)
        for offset in [offset for offset in self._snapshots if offset > point]:
            del self._snapshots[offset]
        for layer, saved in zip(self.layers, self._snapshots.get(point, [None] * len(self.layers))):
            if layer.trim_floor <= point:
                layer.trim(layer.offset - point)
            else:
                layer.restore(saved)  # None, at position 0: empty
        del self.tokens[point:]
        self._count()
        return point

    def capture_points(self, start: int, end: int) -> Sequence[int]:
        if not any(self._kept_whole):
            return ()
        every = range((start // self.interval + 1) * self.interval, end, self.interval)
        points = {*every, *(end - back for back in SNAPSHOTS_BEFORE_END if end - back > start)}
        self._wanted = points | {end}
        return sorted(points)

    def prefilled(self) -> None:
        # At the first chunk end at or past a capture point: the engine may move one (never into an image).
        length = len(self.tokens)
        if self._wanted and min(self._wanted) <= length:
            self._wanted = {point for point in self._wanted if point > length}
            self._snapshots[length] = [layer.snapshot() if whole else None
                                       for whole, layer in zip(self._kept_whole, self.layers)]
            self._thin()
            self._count()

    def finished(self) -> None:
        self._wanted = set()

    def adopt(self, layers: list[Any], tokens: list[int]) -> None:
        """The snapshots along the path the new live caches share with the old stay; the rest are dropped."""
        shared = common_prefix(self.tokens, tokens)
        for offset in [offset for offset in self._snapshots if offset > shared]:
            del self._snapshots[offset]
        super().adopt(layers, tokens)
        self._count()

    def stats(self) -> dict[str, int]:
        return self._stats  # replaced, never changed: a status request may read it from another thread

    def _count(self) -> None:
        held = sum(array.nbytes for array in snapshot_arrays(list(self._snapshots.values())))
        self._stats = {"bytes": held, "nodes": len(self._snapshots)}

    def _restore_point(self, keep: int) -> int:
        """The latest position at or before `keep` every layer can be brought back to."""
        if all(layer.trim_floor <= keep for layer in self.layers):
            return keep
        return max((offset for offset in self._snapshots if offset <= keep), default=0)

    def _thin(self) -> None:
        """Drop older snapshots, each time the one whose neighbours lie closest together, until `limit` remain."""
        offsets = sorted(self._snapshots)
        while len(offsets) > self.limit:
            thinnable = range(max(len(offsets) - len(SNAPSHOTS_BEFORE_END) - 1, 1))
            spans = [(offsets[i + 1] - (offsets[i - 1] if i else 0), i) for i in thinnable]
            del self._snapshots[offsets.pop(min(spans)[1])]


def single_slot(model: nn.Module) -> SingleSlotPolicy:
    return SingleSlotPolicy(model)


def make_policy(factory: str, model: nn.Module, budget: int | None = None) -> RunnerCachePolicy:
    """The policy built by `factory` for `model`; `budget`, the bytes the scheduler granted it, when it has one."""
    module, _, name = factory.partition(":")
    make = getattr(importlib.import_module(module), name)
    return make(model) if budget is None else make(model, budget=budget)
