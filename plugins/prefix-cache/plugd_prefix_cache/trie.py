"""A compressed token trie whose nodes carry, per cache layer, a snapshot (plugd.nn.cache) of their edge.

A spanning layer's (plain KV) snapshot is a KVSpan over the edge's positions,
so any prefix of an edge can be restored by slicing. A node on the live path
is `lazy`: its keys and values are the live buffer's over [start, end), and
its KV snapshots are None until it is materialised. Any other layer (recurrent
state, rotating window) is snapshotted whole at the edge's end, so it restores
only at node ends; None marks an end that was never captured (the head of a
split).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from plugd.nn.cache import snapshot_arrays
from plugd.runner_api import common_prefix


@attrs.define(eq=False)
class Node:
    tokens: list[int]  # the edge from the parent
    start: int  # depth of the edge's first token
    parent: Node | None = None
    children: dict[int, Node] = attrs.Factory(dict)
    snapshots: list[Any] = attrs.Factory(list)  # one per layer
    lazy: bool = False  # the KV of the edge is the live buffer's, not a copy
    last_used: int = 0

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    def nbytes(self, shared: frozenset[int] = frozenset()) -> int:
        """Bytes of the snapshots, less arrays whose ids are in `shared` (held by the live caches anyway)."""
        return sum(array.nbytes for array in snapshot_arrays(self.snapshots) if id(array) not in shared)

    def restorable_at_end(self, sliced: Sequence[bool]) -> bool:
        return all(kv or snapshot is not None for kv, snapshot in zip(sliced, self.snapshots))

    def split(self, length: int, sliced: Sequence[bool]) -> Node:
        """Cut the edge after `length` tokens: this node keeps the head, a new child takes the tail, the children
        and the end states; the head's end states are unknown (None) until captured. Returns the tail."""
        tail = Node(self.tokens[length:], self.start + length, self, self.children, lazy=self.lazy,
                    last_used=self.last_used)
        for child in tail.children.values():
            child.parent = tail
        head_snapshots = []
        for kv, snapshot in zip(sliced, self.snapshots):
            if kv and snapshot is not None:
                head_snapshots.append(snapshot.part(0, length))
                tail.snapshots.append(snapshot.part(length))
            else:
                head_snapshots.append(None)
                tail.snapshots.append(snapshot)
        self.tokens = self.tokens[:length]
        self.snapshots = head_snapshots
        self.children = {tail.tokens[0]: tail}
        return tail

    def merge_into_child(self) -> None:
        """Leave the trie by handing the edge to the only child, which keeps its own end states. Both are lazy,
        so no keys or values move."""
        (child,) = self.children.values()
        child.tokens = self.tokens + child.tokens
        child.start = self.start
        child.parent = self.parent
        child.last_used = max(child.last_used, self.last_used)
        self.parent.children[child.tokens[0]] = child


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
        ahead = tokens[depth : depth + len(child.tokens)]
        if ahead != child.tokens:  # compared as whole lists first: a Python loop over every token is slow
            depth += common_prefix(child.tokens, ahead)
            break
        depth += len(child.tokens)
        node = child
    return Match(path, depth)


def descendants(node: Node) -> Iterator[Node]:
    for child in node.children.values():
        yield child
        yield from descendants(child)


def media_boundary(keys: Sequence[int], depth: int) -> int:
    """`depth`, or the start of the media item it would fall inside: a media item is a run of one negative key,
    and no cache state is ever taken partway into one."""
    while 0 < depth < len(keys) and keys[depth] < 0 and keys[depth - 1] == keys[depth]:
        depth -= 1
    return depth
