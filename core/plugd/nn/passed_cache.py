"""The cache of a layer that another rank runs, in a model split into a pipeline (plugd.nn.pipeline).

It follows the cache protocol (plugd.nn.cache) as a key/value cache with no heads would: it counts the positions
that pass through its layer, trims back to any of them and snapshots any span of them, and holds nothing. Cache
policies and the batched engine take it as they take plain KV, so a rank's policy keeps and restores its own
layers' caches beside it unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import mlx.core as mx


class PassedSpan(NamedTuple):
    """A snapshot of `length` positions of a PassedCache: nothing but their count."""

    length: int

    def part(self, begin: int, end: int | None = None) -> PassedSpan:
        return PassedSpan(len(range(self.length)[begin:end]))

    view = part


class PassedCache:
    spans = True
    trimmable = True
    trim_floor = 0
    nbytes = 0

    def __init__(self, offset: int = 0):
        self.offset = offset
        # What a prefill evaluates of this cache (its `state`): after this rank's stage, a dependency on the hidden
        # states sent on to the next rank, since evaluating them is what sends them.
        self.state: mx.array | None = None

    def passed(self, hidden: mx.array, sent: bool) -> None:
        """`hidden` (batch, length, dims) went past this cache's layer; `sent`: on to the next rank."""
        self.offset += hidden.shape[1]
        if sent:
            self.state = mx.depends(mx.zeros(()), hidden)

    def trim(self, n: int) -> int:
        n = min(n, self.offset)
        self.offset -= n
        return n

    def snapshot(self, start: int = 0, end: int | None = None) -> PassedSpan | None:
        end = self.offset if end is None else end
        return PassedSpan(end - start) if end > start else None

    def restore(self, snapshot: PassedSpan | None) -> None:
        if snapshot is not None:
            self.offset += snapshot.length

    def batch(self) -> BatchPassedCache:
        return BatchPassedCache()


class BatchPassedCache:
    """The PassedCaches of a batch's rows: each row's count of positions."""

    nbytes = 0

    def __init__(self):
        self.offsets: list[int] = []

    @property
    def offset(self) -> mx.array:
        return mx.array(self.offsets, mx.int32)

    def passed(self, hidden: mx.array, sent: bool) -> None:
        """A decode step's evaluation reaches the transfers through the logits: nothing to keep for them."""
        self.offsets = [offset + hidden.shape[1] for offset in self.offsets]

    def extend(self, caches: Sequence[PassedCache], limits: Sequence[int] = ()) -> None:
        self.offsets += [cache.offset for cache in caches]

    def keep(self, rows: Sequence[int]) -> None:
        self.offsets = [self.offsets[r] for r in rows]

    def row(self, r: int) -> PassedCache:
        return PassedCache(self.offsets[r])
