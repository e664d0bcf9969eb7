"""Drafters, which propose the next few tokens for the target model to verify (plugd.runner.speculative), and the
model that keeps a drafter's caches level with the target's.

A drafter's caches ride at the end of the model's cache list (`Drafted`), so every forward pass the engine runs
(prefill chunks, decode steps, a verification) brings them along with the target's, and the cache policies, which
see one list of caches, trim, snapshot and restore them with the rest: a prompt resumed from a restore point, or
retried after a cancelled prefill, finds the draft exactly where the target is. The price is the drafter's share
of every forward pass, drafting or not (a tenth, for a draft a tenth of the target's size).
"""

from __future__ import annotations

from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten


class Drafter(Protocol):
    weight_bytes: int  # what its parameters hold: next to the target's, what a drafted token costs

    def make_cache(self) -> list[Any]:
        """The drafter's caches, which follow the cache protocol (plugd.nn.cache) as the target's do."""

    def follow(self, tokens: mx.array, cache: list[Any]) -> mx.array:
        """Bring `cache` along over `tokens` (batch, length), which the target has just been fed; lazy. What it
        returns is evaluated whenever the target's logits are, so the caches never fall behind."""

    def propose(self, token: mx.array, cache: list[Any]) -> mx.array:
        """Feed one (1,) token and give the drafter's logits for the position after it, (vocab,), lazy."""


class DraftModel:
    """A smaller model with the target's vocabulary drafts for it."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.weight_bytes = weight_bytes(model)

    def make_cache(self) -> list[Any]:
        return self.model.make_cache()

    def follow(self, tokens: mx.array, cache: list[Any]) -> mx.array:
        return self.model(tokens, cache=cache)[:, -1]

    def propose(self, token: mx.array, cache: list[Any]) -> mx.array:
        return self.model(token.reshape(1, 1), cache=cache)[0, -1]


class Drafted:
    """The target model with a drafter: its caches are the target's followed by the drafter's, and each call runs
    both over the same tokens, returning the target's logits. Everything else is the target's."""

    def __init__(self, target: nn.Module, drafter: Drafter):
        self.target, self.drafter = target, drafter
        self.split = len(target.make_cache())

    def make_cache(self) -> list[Any]:
        return [*self.target.make_cache(), *self.drafter.make_cache()]

    def __call__(self, tokens: mx.array, cache: list[Any] | None = None, **kwargs: Any) -> mx.array:
        if cache is None:
            return self.target(tokens, **kwargs)
        logits = self.target(tokens, cache=self.own(cache), **kwargs)
        return mx.depends(logits, self.drafter.follow(tokens, self.drafts(cache)))

    def own(self, cache: list[Any]) -> list[Any]:
        """The target's caches of a list `make_cache` made."""
        return cache[: self.split]

    def drafts(self, cache: list[Any]) -> list[Any]:
        """The drafter's caches of a list `make_cache` made."""
        return cache[self.split :]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


def weight_bytes(module: nn.Module) -> int:
    return sum(array.nbytes for _, array in tree_flatten(module.parameters()))
