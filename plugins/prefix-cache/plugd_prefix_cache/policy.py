"""The prefix-cache policy: the live caches plus a token trie of restore points, evicted LRU under a byte budget.

Exactly one root-to-leaf path of the trie is live: its nodes are lazy views
of the live KV buffer and cost nothing. After every prefill chunk and at the
end of every completion the live tokens are inserted, each new node capturing
the rotating-window and recurrent states at its end, so a cancelled prefill
leaves a restore point at every chunk it finished. Only when the live buffer
is about to be overwritten below a node's end (a prompt that leaves the live
path) is that node's KV copied out ("paged out"); a node restored onto the
live path gives its copy up again.

A completion resumes from whichever is longer: the live caches' common prefix
(trimmed in place) or the deepest restorable point in the trie. Eviction is
LRU under a byte budget over what the trie holds beyond the live caches: a
paged-out leaf is dropped, a live-path node is merged into its child (its end
states dropped, its KV never copied); the live frontier and branch points stay.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from plugd.nn.cache import snapshot_arrays
from plugd.runner_api import LiveCache, common_prefix
from plugd_prefix_cache.budget import default_budget
from plugd_prefix_cache.trie import Node, descendants, media_boundary, walk

DEFAULT_INTERVAL = 512
# Restore points this far before a prompt's end: the next turn of an agent often drops the end (a runtime reminder),
# and a cache that cannot be trimmed (recurrent state) resumes only from a restore point before it. Doubling
# margins waste at most about as many tokens as the dropped end has; on bench/prefix_cache.py's session replayed
# on tiny hybrid checkpoints (its reminder is ~75 tokens) they bring the tokens evaluated from 1.37x to 1.12x the
# new ones.
DEFAULT_TAIL_MARGINS = (16, 32, 64, 128, 256)


class PrefixCachePolicy(LiveCache):
    def __init__(self, model: nn.Module, budget: int | None = None, interval: int | None = None,
                 tail_margins: Sequence[int] = DEFAULT_TAIL_MARGINS):
        self.budget = default_budget() if budget is None else budget
        self.interval = interval or int(os.environ.get("PLUGD_PREFIX_CACHE_INTERVAL", DEFAULT_INTERVAL))
        self.tail_margins = tuple(tail_margins)
        self.root = Node([], 0)
        self.tokens: list[int] = []
        self._prompt: list[int] = []
        self._clock = 0
        super().__init__(model)

    def reset(self) -> None:
        """Fresh live caches; the live path is paged out first, so the trie keeps all of it."""
        try:
            self._page_out_beyond(0)
        except Exception:  # a step that failed can leave the live buffer unreadable: forget what only it held
            self.root = Node([], 0)
        super().reset()
        # Caches that span (plain KV) are kept per edge (lazily while live); the others whole, at node ends.
        self.sliced = [layer.spans for layer in self.layers]
        self._evict()

    def resume(self, prompt: Sequence[int]) -> int:
        self._clock += 1
        self._prompt = list(prompt)
        target = self._prompt[:-1]
        live = media_boundary(self._prompt, common_prefix(self.tokens, target))
        depth = self._restorable_depth(target)
        if live >= depth:
            self._page_out_beyond(live)
            if self.trim_to(live):
                self._store()  # the branch point left behind gets the end states a cache kept whole lacks there
                return live
        self._restore(target, depth, min(live, depth))
        self._evict()
        return depth

    def capture_points(self, start: int, end: int) -> Sequence[int]:
        """The interval's multiples; where a cache kept whole needs a state that a KV cache can always be cut to:
        where the prompt crosses a node boundary or leaves a stored path (branch points); and, for a cache that
        cannot be trimmed, a few points before the end."""
        points = set(range((start // self.interval + 1) * self.interval, end, self.interval))
        if not all(self.sliced):
            match = walk(self.root, self._prompt[:end])
            points.update(node.end for node in match.path if node.end <= match.depth)
            points.add(match.depth)
        if not all(layer.trimmable for layer in self.layers):  # a window trims back further than these margins
            points.update(end - margin for margin in self.tail_margins)
        return sorted(p for p in points if start < p < end and media_boundary(self._prompt, p) == p)

    def prefilled(self) -> None:
        self._store()

    def finished(self) -> None:
        self._store()

    def adopt(self, layers: list[Any], tokens: list[int]) -> None:
        """The new live caches hold the same KV as the old over their common prefix, so the live path's nodes
        there stay lazy; only what the old held beyond it is paged out."""
        self._page_out_beyond(common_prefix(self.tokens, tokens))
        super().adopt(layers, tokens)
        self._store()

    def stats(self) -> dict[str, int]:
        return dict(self._stats)  # counted on the MLX thread: a status request may read it from another

    def _restorable_depth(self, target: list[int]) -> int:
        """The deepest point along `target` the trie can restore the caches to (never inside a media item)."""
        match = walk(self.root, target)
        depth = media_boundary(self._prompt, match.depth)
        path = [node for node in match.path if node.start < depth]
        if path and depth < path[-1].end:
            if all(self.sliced):
                return depth
            path.pop()  # a cache kept whole has no state partway into an edge
        while path and not path[-1].restorable_at_end(self.sliced):
            path.pop()
        return path[-1].end if path else 0

    def _restore(self, target: list[int], depth: int, kept: int) -> None:
        """Bring the caches to target[:depth]: the live KV keeps its first `kept` positions, the trie gives the
        rest of the KV and the end states, and the nodes restored become the live path."""
        self._page_out_beyond(kept)
        path = walk(self.root, target[:depth]).path
        if path and depth < path[-1].end:
            path[-1].split(depth - path[-1].start, self.sliced)
        for i, layer in enumerate(self.layers):
            if self.sliced[i]:
                layer.trim(layer.offset - kept)
                for node in path:
                    if node.end > kept:
                        layer.restore(node.snapshots[i].view(max(kept - node.start, 0)))
            else:
                layer.restore(path[-1].snapshots[i] if path else None)
        mx.eval([layer.state for layer in self.layers])
        for node in path:
            self._make_lazy(node)
        self.tokens = target[:depth]
        self._touch(path)

    def _page_out_beyond(self, length: int) -> None:
        """Copy out the KV of the live path past `length`, which the live buffer is about to lose; a node
        straddling `length` is split there and only its tail is copied."""
        nodes = [node for node in walk(self.root, self.tokens).path if node.lazy and node.end > length]
        if not nodes:
            return
        if nodes[0].start < length:
            nodes[0] = nodes[0].split(length - nodes[0].start, self.sliced)
        for node in nodes:
            node.snapshots = [layer.snapshot(node.start, node.end) if kv else snapshot
                              for kv, layer, snapshot in zip(self.sliced, self.layers, node.snapshots)]
            node.lazy = False
        mx.eval([node.snapshots for node in nodes])

    def _make_lazy(self, node: Node) -> None:
        """The node's KV is in the live buffer now: drop its copy."""
        node.snapshots = [None if kv else snapshot for kv, snapshot in zip(self.sliced, node.snapshots)]
        node.lazy = True

    def _store(self) -> None:
        """Insert the live tokens into the trie as the live path, capturing end states where a node ends at the
        live offset."""
        length = len(self.tokens)
        match = walk(self.root, self.tokens)
        if match.path and match.depth < match.path[-1].end:
            match.path[-1].split(match.depth - match.path[-1].start, self.sliced)
        path = match.path
        for node in path:
            if not node.lazy:
                self._make_lazy(node)
        if match.depth < length:
            parent = path[-1] if path else self.root
            node = Node(self.tokens[match.depth :], match.depth, parent, snapshots=self._live_ends(), lazy=True)
            parent.children[node.tokens[0]] = node
            path.append(node)
        elif path and not path[-1].restorable_at_end(self.sliced):
            ends = self._live_ends()
            path[-1].snapshots = [state if old is None else old for old, state in zip(path[-1].snapshots, ends)]
        self._touch(path)
        self._evict()

    def _live_ends(self) -> list[Any]:
        """The whole-kept layers' snapshots now (None for spanning layers)."""
        ends = [None if kv else layer.snapshot() for kv, layer in zip(self.sliced, self.layers)]
        mx.eval(ends)
        return ends

    def _touch(self, path: list[Node]) -> None:
        for node in path:
            node.last_used = self._clock

    def _evict(self) -> None:
        """Evict least recently used nodes until what the trie holds beyond the live caches fits the budget: a
        paged-out leaf is dropped, a live-path node merged into its child; the live frontier and branch points
        stay."""
        shared = frozenset(id(array) for kv, layer in zip(self.sliced, self.layers) if not kv
                           for array in snapshot_arrays(layer.state))
        nodes = list(descendants(self.root))
        held = {node: node.nbytes(shared) for node in nodes}
        total = sum(held.values())
        live_path = walk(self.root, self.tokens).path
        frontier = live_path[-1] if live_path else None
        while total > self.budget:
            candidates = [node for node in nodes if node is not frontier and held[node] > 0
                          and (not node.children if not node.lazy else len(node.children) == 1)]
            if not candidates:
                break
            victim = min(candidates, key=lambda node: (node.last_used, node.start))
            if victim.lazy:
                victim.merge_into_child()
            else:
                del victim.parent.children[victim.tokens[0]]
            nodes.remove(victim)
            total -= held.pop(victim)
        self._stats = {"bytes": total, "nodes": len(nodes), "budget": self.budget}


def prefix_cache(model: nn.Module, budget: int | None = None) -> PrefixCachePolicy:
    return PrefixCachePolicy(model, budget)
