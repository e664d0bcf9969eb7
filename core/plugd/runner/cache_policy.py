"""What the runner keeps of its caches from one completion to the next: the cache policy.

The engine owns generation; a policy owns the model's caches (`layers`) and the
tokens they hold (`tokens`). Per completion the engine calls, in order:

- `resume(prompt)`: bring `layers` to the longest prefix of `prompt` (short of
  its last token) the policy can give back, and return its length;
- `capture_points(start, end)`: positions in (start, end) where the prefill
  should pause so the policy can take a restore point; the engine ends a chunk
  at each;
- `prefilled()` after every prefill chunk: `layers` hold exactly `tokens`, the
  moment to capture what a retry after a cancellation can resume from;
- `finished()` once the completion ends, however it ends.

A policy is made by a factory `module:callable` named by a `CachePolicy` hook
descriptor, called with the loaded model (whose `make_cache()` gives fresh
caches) and, for a policy that declares a budget, `budget=` the bytes the
scheduler granted it. plugd.cache_policies says which policy runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn

from plugd.nn.cache import KVCache


class RunnerCachePolicy(Protocol):
    layers: list[Any]
    tokens: list[int]

    def resume(self, prompt: Sequence[int]) -> int: ...

    def reserve(self, positions: int, expected: int = 0) -> None: ...

    def capture_points(self, start: int, end: int) -> Sequence[int]: ...

    def prefilled(self) -> None: ...

    def finished(self) -> None: ...

    def reset(self) -> None: ...

    def stats(self) -> dict[str, int]: ...


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length


class LiveCache:
    """The model's caches and the tokens they hold; the part every policy shares.

    Invariant between steps: every layer's offset equals len(tokens).
    """

    def __init__(self, model: nn.Module):
        self._model = model
        self._reserved = (0, 0)
        self.reset()

    def reset(self) -> None:
        self.layers = self._model.make_cache()
        self.tokens: list[int] = []
        self.reserve(*self._reserved)

    def trim_to(self, length: int) -> bool:
        """Forget every token past `length`; False (caches untouched past `length` not guaranteed) when a layer
        cannot forget that much."""
        excess = len(self.tokens) - length
        if any(layer.trim(excess) != excess for layer in self.layers):
            return False
        del self.tokens[length:]
        return True

    def reserve(self, positions: int, expected: int = 0) -> None:
        """Tell the caches the context's size (`positions`, which they never grow past, as the fit check counts)
        and what the completion under way should reach (`expected`, allocated at once at their next growth, so
        that memory stays flat while it decodes); beyond that they double as they fill."""
        self._reserved = (positions, expected)
        for layer in self.layers:
            if hasattr(layer, "reserve"):
                layer.reserve(positions, expected)

    def capture_points(self, start: int, end: int) -> Sequence[int]:
        return ()

    def prefilled(self) -> None:
        pass

    def finished(self) -> None:
        pass

    def stats(self) -> dict[str, int]:
        return {"bytes": 0, "nodes": 0}


# Where the single-slot policy snapshots the layers that cannot trim back (recurrent, sliding-window).
SNAPSHOT_INTERVAL = 1024  # along the live path, every this many tokens
SNAPSHOTS_BEFORE_END = (256, 64, 16)  # this far before each prompt's end, where an agent's next prompt departs
SNAPSHOT_LIMIT = 8  # at most this many on the path; the newest len(SNAPSHOTS_BEFORE_END) + 1 are never thinned


class SingleSlotPolicy(LiveCache):
    """The built-in policy: keep the last completion's live caches and reuse their longest common prefix.

    Plain KV layers trim back to any position. The others (a recurrent state, a sliding window that dropped its
    oldest keys) cannot, so the policy snapshots them along the live path, at capture points the prefill stops
    at: every `interval` tokens, a few positions before the prompt's end (an agent's next prompt typically keeps
    the transcript and replaces what followed it) and at the prompt's end (the same prompt again). A prompt that
    departs from the live path resumes from the latest position at or before the departure that every layer can
    reach: trimmed back, or restored from a snapshot there. Taking a snapshot copies nothing (it holds references
    to immutable MLX arrays); it costs the memory it keeps alive, so at most `limit` are kept: when there are
    more, the older ones are thinned where they lie closest together. `stats()` counts them ("nodes") and the
    bytes they hold.
    """

    def __init__(self, model: nn.Module, interval: int = SNAPSHOT_INTERVAL, limit: int = SNAPSHOT_LIMIT):
        self.interval, self.limit = interval, limit
        self._snapshots: dict[int, list[Any]] = {}  # offset -> each layer's state there (None for plain KV layers)
        self._wanted: set[int] = set()  # offsets the current prefill stops at to snapshot, those not reached
        self._stats = {"bytes": 0, "nodes": 0}
        super().__init__(model)
        self._kept_whole = [not isinstance(layer, KVCache) for layer in self.layers]

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
                layer.state = saved  # None, at position 0: empty
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
            self._snapshots[length] = [layer.state if whole else None
                                       for whole, layer in zip(self._kept_whole, self.layers)]
            self._thin()
            self._count()

    def finished(self) -> None:
        self._wanted = set()

    def stats(self) -> dict[str, int]:
        return self._stats  # replaced, never changed: a status request may read it from another thread

    def _count(self) -> None:
        arrays = [array for states in self._snapshots.values() for state in states if state is not None
                  for array in state if isinstance(array, mx.array)]
        self._stats = {"bytes": sum(array.nbytes for array in arrays), "nodes": len(self._snapshots)}

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
