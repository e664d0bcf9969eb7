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
caches). PLUGD_CACHE_POLICY picks one by name; unset, "prefix-cache" when a
plugin provides it, else the built-in "single-slot".
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any, Protocol

import mlx.nn as nn

BUILTIN_POLICY = "single-slot"
PREFERRED_POLICY = "prefix-cache"


class RunnerCachePolicy(Protocol):
    layers: list[Any]
    tokens: list[int]

    def resume(self, prompt: Sequence[int]) -> int: ...

    def reserve(self, positions: int) -> None: ...

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
        self._reserved = 0
        self.reset()

    def reset(self) -> None:
        self.layers = self._model.make_cache()
        self.tokens: list[int] = []
        self.reserve(self._reserved)

    def trim_to(self, length: int) -> bool:
        """Forget every token past `length`; False (caches untouched past `length` not guaranteed) when a layer
        cannot forget that much."""
        excess = len(self.tokens) - length
        if any(layer.trim(excess) != excess for layer in self.layers):
            return False
        del self.tokens[length:]
        return True

    def reserve(self, positions: int) -> None:
        """Size the caches for a whole context up front: memory stays flat as it fills, and matches the fit check."""
        self._reserved = positions
        for layer in self.layers:
            if hasattr(layer, "reserve"):
                layer.reserve(positions)

    def capture_points(self, start: int, end: int) -> Sequence[int]:
        return ()

    def prefilled(self) -> None:
        pass

    def finished(self) -> None:
        pass

    def stats(self) -> dict[str, int]:
        return {"bytes": 0, "nodes": 0}


class SingleSlotPolicy(LiveCache):
    """The built-in policy: keep the last completion's live caches and reuse their longest common prefix."""

    def resume(self, prompt: Sequence[int]) -> int:
        keep = common_prefix(self.tokens, prompt[:-1])
        if not self.trim_to(keep):
            self.reset()  # a cache that cannot forget that much starts over
            return 0
        return keep


def single_slot(model: nn.Module) -> SingleSlotPolicy:
    return SingleSlotPolicy(model)


def chosen_factory(policies: dict[str, Any], wanted: str | None = None) -> str:
    """The factory path of the policy named by PLUGD_CACHE_POLICY (or `wanted`), else the preferred default."""
    wanted = wanted or os.environ.get("PLUGD_CACHE_POLICY")
    if wanted:
        if wanted not in policies:
            raise ValueError(f"unknown cache policy {wanted!r}; available: {', '.join(sorted(policies))}")
        return policies[wanted].factory
    return policies.get(PREFERRED_POLICY, policies[BUILTIN_POLICY]).factory


def make_policy(factory: str, model: nn.Module) -> RunnerCachePolicy:
    module, _, name = factory.partition(":")
    return getattr(importlib.import_module(module), name)(model)
