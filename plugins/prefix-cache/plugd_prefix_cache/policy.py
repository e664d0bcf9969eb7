"""The prefix-cache policy: the live caches plus a token trie of restore points, evicted LRU under a byte budget.

The live caches hold one root-to-leaf path of the trie. After every prefill
chunk and at the end of every completion the live tokens are inserted, each
new node snapshotting its own edge, so a cancelled prefill leaves a restore
point at every chunk it finished and a retry resumes from the last one.
A completion resumes from whichever is longer: the live caches' common prefix
(trimmed in place) or the deepest restorable point in the trie.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from plugd.nn.cache import KVCache
from plugd.runner.cache_policy import LiveCache, common_prefix
from plugd_prefix_cache.trie import Match, Node, descendants, walk

BUDGET_SHARE_OF_MEMORY = 8  # the default budget is this fraction of physical memory
DEFAULT_INTERVAL = 512


def default_budget() -> int:
    """PLUGD_PREFIX_CACHE_BYTES, else an eighth of physical memory: small machines get a small cache."""
    if value := os.environ.get("PLUGD_PREFIX_CACHE_BYTES"):
        return int(value)
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // BUDGET_SHARE_OF_MEMORY
    except (ValueError, OSError):
        return 1 << 30


class PrefixCachePolicy(LiveCache):
    def __init__(self, model: nn.Module, budget: int | None = None, interval: int | None = None):
        super().__init__(model)
        self.budget = default_budget() if budget is None else budget
        self.interval = interval or int(os.environ.get("PLUGD_PREFIX_CACHE_INTERVAL", DEFAULT_INTERVAL))
        # Plain KV caches are kept per edge; rotating-window and recurrent caches whole, at node ends.
        self.sliced = [isinstance(layer, KVCache) for layer in self.layers]
        self.root = Node([], 0)
        self._clock = 0
        self._stats = {"bytes": 0, "nodes": 0}

    def resume(self, prompt: Sequence[int]) -> int:
        self._clock += 1
        target = prompt[:-1]
        live = common_prefix(self.tokens, target)
        depth, path = self._restorable(walk(self.root, target))
        if live >= depth and self.trim_to(live):
            self._touch(walk(self.root, self.tokens).path)
            return live
        if depth == 0:
            self.reset()
            return 0
        self._restore(path, depth)
        self.tokens = list(target[:depth])
        return depth

    def capture_points(self, start: int, end: int) -> Sequence[int]:
        return range((start // self.interval + 1) * self.interval, end, self.interval)

    def prefilled(self) -> None:
        self._store()

    def finished(self) -> None:
        self._store()

    def stats(self) -> dict[str, int]:
        return dict(self._stats)  # counted on the MLX thread: a status request may read it from another

    def _restorable(self, match: Match) -> tuple[int, list[Node]]:
        """The deepest point of `match` the caches can be restored to, and the nodes that lead there."""
        path = list(match.path)
        if path and match.depth < path[-1].end:
            if all(self.sliced):
                return match.depth, path
            path.pop()  # a cache kept whole has no state partway into an edge
        while path and not path[-1].restorable_at_end(self.sliced):
            path.pop()
        return (path[-1].end if path else 0), path

    def _restore(self, path: list[Node], depth: int) -> None:
        cut = depth - path[-1].start
        for i, layer in enumerate(self.layers):
            if self.sliced[i]:
                keys = [node.snapshots[i][0] for node in path]
                values = [node.snapshots[i][1] for node in path]
                keys[-1], values[-1] = keys[-1][..., :cut, :], values[-1][..., :cut, :]
                layer.state = (mx.concatenate(keys, axis=2), mx.concatenate(values, axis=2))
            else:
                layer.state = path[-1].snapshots[i]
        self._touch(path)

    def _store(self) -> None:
        """Insert the live tokens into the trie, snapshotting only what it does not hold yet."""
        length = len(self.tokens)
        if length == 0:
            return
        match = walk(self.root, self.tokens)
        self._touch(match.path)
        parent = match.path[-1] if match.path else self.root
        if match.path and match.depth < parent.end:
            at_live_offset = match.depth == length
            parent.split(match.depth - parent.start, self.sliced, self._live_ends() if at_live_offset else None)
        elif match.depth == length and parent is not self.root:
            self._fill_ends(parent)
        if match.depth < length:
            node = Node(self.tokens[match.depth :], match.depth, parent, snapshots=self._segment(match.depth, length),
                        last_used=self._clock)
            parent.children[node.tokens[0]] = node
        self._evict()

    def _segment(self, start: int, end: int) -> list[Any]:
        """Each layer's snapshot over positions [start, end): copies, so the live buffer stays writable in place."""
        snapshots = []
        for kv, layer in zip(self.sliced, self.layers):
            if kv:
                keys, values = layer.state
                snapshots.append((mx.contiguous(keys[..., start:end, :]), mx.contiguous(values[..., start:end, :])))
            else:
                snapshots.append(layer.state)
        mx.eval(snapshots)
        return snapshots

    def _live_ends(self) -> list[Any]:
        return [None if kv else layer.state for kv, layer in zip(self.sliced, self.layers)]

    def _fill_ends(self, node: Node) -> None:
        """A node ending exactly at the live offset gets the whole-kept states it lacks (a split's head)."""
        for i, state in enumerate(self._live_ends()):
            if state is not None and node.snapshots[i] is None:
                node.snapshots[i] = state

    def _touch(self, path: list[Node]) -> None:
        for node in path:
            node.last_used = self._clock

    def _evict(self) -> None:
        """Drop least recently used leaves until the trie fits the budget, those off the live path first."""
        nodes = list(descendants(self.root))
        total = sum(node.nbytes for node in nodes)
        live = set(walk(self.root, self.tokens).path)
        while total > self.budget:
            leaves = [node for node in nodes if not node.children]
            victim = min([node for node in leaves if node not in live] or leaves, key=lambda node: node.last_used)
            del victim.parent.children[victim.tokens[0]]
            nodes.remove(victim)
            total -= victim.nbytes
        self._stats = {"bytes": total, "nodes": len(nodes)}


def prefix_cache(model: nn.Module) -> PrefixCachePolicy:
    return PrefixCachePolicy(model)
