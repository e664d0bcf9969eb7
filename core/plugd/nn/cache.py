"""The cache protocol every layer cache implements, and the key/value cache of attention layers.

A cache policy (plugd.runner_api) works with any layer cache through the `Cache` protocol: how far it is
(`offset`), how far back it can `trim`, snapshots, and the bytes it holds. A cache that `spans` (keys and values)
snapshots any span of its positions and restores by appending one; the others (a sliding window, a recurrent
state) snapshot and restore their whole state only. `batch()` gives the empty batch cache (plugd.nn.batch_cache)
that decodes caches of this kind for several sequences at once. A new kind of cache implements the protocol and
both policies, and the batched engine, take it as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import mlx.core as mx

from plugd.constants import CACHE_STEP

if TYPE_CHECKING:
    from plugd.nn.batch_cache import BatchKVCache


class Cache(Protocol):
    offset: int  # positions seen
    spans: bool  # snapshots cover any span of positions (see KVSpan), not only the whole state
    trimmable: bool  # trims back by more than a few positions (a recurrent state cannot trim at all)

    @property
    def trim_floor(self) -> int:
        """The earliest offset `trim` can go back to."""

    def trim(self, n: int) -> int:
        """Forget up to the last n positions; return how many were forgotten."""

    def snapshot(self, start: int = 0, end: int | None = None) -> Any:
        """What later updates leave as it is, and `restore` takes back: for a spanning cache, its positions
        [start, end) (end: the offset) as a KVSpan; for the others the whole state (start and end ignored).
        None when there is nothing to keep."""

    def restore(self, snapshot: Any) -> None:
        """A spanning cache appends the span's positions at its offset; the others take the state back
        (None: empty)."""

    @property
    def nbytes(self) -> int:
        """The bytes of the arrays the cache holds, room allocated ahead included."""

    def batch(self) -> Any:
        """An empty batch cache for caches like this one: `extend(caches, limits)` adds rows continuing them,
        `keep(rows)` drops the others, `row(r)` copies a row back out as a cache like this one."""


class KVSpan(NamedTuple):
    """Keys and values over a span of positions, (batch, kv_heads, length, head_dim), owned copies."""

    keys: mx.array
    values: mx.array

    @property
    def length(self) -> int:
        return self.keys.shape[2]

    def part(self, begin: int, end: int | None = None) -> KVSpan:
        """The positions [begin, end) of this span, copied: what it holds no longer keeps the whole alive."""
        view = self.view(begin, end)
        return KVSpan(mx.contiguous(view.keys), mx.contiguous(view.values))

    def view(self, begin: int, end: int | None = None) -> KVSpan:
        """The positions [begin, end) of this span, sharing its memory (to restore from: the cache copies in)."""
        return KVSpan(self.keys[..., begin:end, :], self.values[..., begin:end, :])


def snapshot_arrays(snapshot: Any) -> Iterator[mx.array]:
    """The arrays a snapshot (or a list of them) holds, to count their bytes or evaluate them."""
    if isinstance(snapshot, mx.array):
        yield snapshot
    elif isinstance(snapshot, tuple | list):
        for part in snapshot:
            yield from snapshot_arrays(part)


class KVCache:
    """The keys and values of every position seen so far, (batch, kv_heads, length, head_dim).

    Storage grows with use, never to all of a context at once: at a
    completion's first write to what the completion is expected to reach (its
    prompt and a bounded share of its output, `reserve`), then doubling (in
    multiples of `step` positions) up to the context's size, so that decoding
    one token writes into place instead of reallocating and a large context
    costs only what its positions use. `offset` is the number of cached
    positions; `trim(n)` forgets the last n, which later writes overwrite.
    """

    spans = True
    trimmable = True

    def __init__(self, step: int = CACHE_STEP):
        self.step = step
        self.reserved = self.expected = 0
        self.offset = 0
        self.keys: mx.array | None = None
        self.values: mx.array | None = None

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Append the new positions' keys and values; return all cached ones, these included."""
        start, end = self.offset, self.offset + keys.shape[2]
        if self.keys is None or end > self.keys.shape[2] or self.keys.shape[2] < self.expected:
            self.keys = self._grown(self.keys, keys, end)
            self.values = self._grown(self.values, values, end)
        self.keys[..., start:end, :] = keys
        self.values[..., start:end, :] = values
        self.offset = end
        return self.keys[..., :end, :], self.values[..., :end, :]

    def reserve(self, positions: int, expected: int = 0) -> None:
        """`positions`: the context's size, which growth stops at (without one it grows by `step`); `expected`:
        the positions the completion under way should reach, allocated at once at its next write (its prefill's,
        before any token is decoded)."""
        self.reserved = positions
        self.expected = min(expected, positions)

    def _grown(self, stored: mx.array | None, new: mx.array, needed: int) -> mx.array:
        def steps(positions: int) -> int:
            return -(-positions // self.step) * self.step

        doubled = 0 if stored is None else 2 * stored.shape[2]
        capacity = max(steps(needed), min(steps(max(doubled, self.expected)), steps(self.reserved)))
        batch, heads, _, dims = new.shape
        room = mx.zeros((batch, heads, capacity - self.offset, dims), new.dtype)
        return room if stored is None else mx.concatenate([stored[..., : self.offset, :], room], axis=2)

    @property
    def trim_floor(self) -> int:
        """The earliest offset `trim` can go back to: any."""
        return 0

    def trim(self, n: int) -> int:
        """Forget the last n positions (at most all of them); return how many were forgotten."""
        n = min(n, self.offset)
        self.offset -= n
        return n

    @property
    def state(self) -> tuple[mx.array, mx.array] | None:
        """A snapshot of exactly the cached positions (None when empty); later updates do not change it."""
        if self.keys is None or self.offset == 0:
            return None
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    @state.setter
    def state(self, snapshot: tuple[mx.array, mx.array] | None) -> None:
        self.keys, self.values = snapshot or (None, None)
        self.offset = 0 if snapshot is None else snapshot[0].shape[2]

    def snapshot(self, start: int = 0, end: int | None = None) -> KVSpan | None:
        end = self.offset if end is None else end
        if self.keys is None or end <= start:
            return None
        return KVSpan(self.keys, self.values).part(start, end)

    def restore(self, snapshot: KVSpan | None) -> None:
        if snapshot is not None:
            self.update_and_fetch(snapshot.keys, snapshot.values)

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes

    def mask(self, queries: int) -> str | None:
        """The mask for the last `queries` positions written, over the keys the last update returned: causal."""
        return "causal" if queries > 1 else None

    def batch(self) -> BatchKVCache:
        from plugd.nn.batch_cache import BatchKVCache

        return BatchKVCache(step=self.step)
