"""A compressed token trie whose nodes carry, per cache layer, a snapshot spanning exactly their edge.

A plain KV layer's snapshot is its keys and values over the edge's
positions, so any prefix of an edge can be restored by slicing. Any other
layer (recurrent state, rotating window) is snapshotted whole at the edge's
end, so it restores only at node ends; None marks an end that was never
captured (the head of a split made away from the live offset).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import mlx.core as mx

from plugd.runner.cache_policy import common_prefix


def snapshot_bytes(snapshot: Any) -> int:
    if isinstance(snapshot, mx.array):
        return snapshot.nbytes
    if isinstance(snapshot, tuple | list):
        return sum(snapshot_bytes(part) for part in snapshot)
    return 0


@attrs.define(eq=False)
class Node:
    tokens: list[int]  # the edge from the parent
    start: int  # depth of the edge's first token
    parent: Node | None = None
    children: dict[int, Node] = attrs.Factory(dict)
    snapshots: list[Any] = attrs.Factory(list)  # one per layer
    last_used: int = 0

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    @property
    def nbytes(self) -> int:
        return snapshot_bytes(self.snapshots)

    def restorable_at_end(self, sliced: Sequence[bool]) -> bool:
        return all(kv or snapshot is not None for kv, snapshot in zip(sliced, self.snapshots))

    def split(self, length: int, sliced: Sequence[bool], head_ends: list[Any] | None) -> Node:
        """Cut the edge after `length` tokens: this node keeps the head, a new child takes the tail (and the
        children). `head_ends` are the unsliced layers' states at the cut, when known."""
        tail = Node(self.tokens[length:], self.start + length, self, self.children, last_used=self.last_used)
        for child in tail.children.values():
            child.parent = tail
        head_snapshots = []
        for i, (kv, snapshot) in enumerate(zip(sliced, self.snapshots)):
            if kv:
                keys, values = snapshot
                head_snapshots.append((keys[..., :length, :], values[..., :length, :]))
                tail.snapshots.append((keys[..., length:, :], values[..., length:, :]))
            else:
                head_snapshots.append(None if head_ends is None else head_ends[i])
                tail.snapshots.append(snapshot)
        self.tokens = self.tokens[:length]
        self.snapshots = head_snapshots
        self.children = {tail.tokens[0]: tail}
        return tail


@attrs.define
class Match:
    """How far a token sequence runs along the trie: the nodes it enters and the depth reached."""

    path: list[Node]
    depth: int


def walk(root: Node, tokens: Sequence[int]) -> Match:
    """The nodes `tokens` enter from the root, the last one possibly only partway."""
    node, depth, path = root, 0, []
    while depth < len(tokens) and (child := node.children.get(tokens[depth])) is not None:
        path.append(child)
        matched = common_prefix(child.tokens, tokens[depth:])
        depth += matched
        if matched < len(child.tokens):
            break
        node = child
    return Match(path, depth)


def descendants(node: Node) -> Iterator[Node]:
    for child in node.children.values():
        yield child
        yield from descendants(child)
