"""The typed boundary between the daemon and its runners: MLX-free, read by both sides through one converter."""

from __future__ import annotations

import json

from attrs import define

from plugd.types import converter


@define(frozen=True)
class RunnerConfig:
    """What a runner is started with: every runner-side choice, made by the daemon from the plugins' descriptors,
    so that the runner loads no plugins of its own."""

    module: str  # the architecture's model module (Architecture.module)
    cache_policy: str  # the cache policy's factory, "module:callable" (CachePolicy.factory)
    cache_budget: int | None = None  # the bytes the policy may keep beyond the live caches; None: it has no budget

    def to_json(self) -> str:
        return json.dumps(converter.unstructure(self))

    @classmethod
    def from_json(cls, text: str) -> RunnerConfig:
        return converter.structure(json.loads(text), cls)
