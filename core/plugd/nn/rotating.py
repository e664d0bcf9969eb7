"""Key/value cache for sliding-window attention: keeps only what the window can still see.

A sliding-window layer with window W lets position q attend to positions
q - W + 1 .. q (itself included). The cache therefore keeps the last W - 1
positions for the next query, plus `slack` more so that the last few positions
can still be forgotten (`trim`) after older ones were dropped. What it dropped
is gone: it cannot trim back past the point where the window's keys would be
missing, and says so by forgetting fewer positions than asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import mlx.core as mx

from plugd.constants import CACHE_STEP, ROTATING_SLACK

if TYPE_CHECKING:
    from plugd.nn.batch_cache import BatchKVCache


class RotatingState(NamedTuple):
    """A snapshot of a RotatingKVCache: keys and values of positions start .. offset - 1."""

    offset: int
    start: int
    keys: mx.array
    values: mx.array


def window_mask(first_query: int, queries: int, first_key: int, keys: int, window: int) -> mx.array | str | None:
    """What each of `queries` consecutive positions may see of `keys` consecutive cached ones (the last key being the
    last query): keys at or before it and fewer than `window` positions back. None or "causal" where that is all
    keys, or a causal triangle aligned to the last key, as scaled_dot_product_attention takes them."""
    if first_key > first_query + queries - 1 - window:  # the oldest key is in the last query's window
        return "causal" if queries > 1 else None
    query_positions = mx.arange(first_query, first_query + queries)[:, None]
    key_positions = mx.arange(first_key, first_key + keys)[None]
    return (key_positions <= query_positions) & (key_positions > query_positions - window)


class RotatingKVCache:
    """Keys and values, (batch, kv_heads, length, head_dim), of the positions `start` .. `offset` - 1.

    Positions are stored in order in a buffer that grows `step` positions at
    a time; when it is full, the positions no later query can see (beyond
    `window - 1 + slack` back) are dropped and the rest moved to its front, so
    decoding writes in place most steps. `update_and_fetch` returns the stored
    keys, the new ones included; `mask(queries)` says which of them each new
    query may see.
    """

    spans = False
    trimmable = True

    def __init__(self, window: int, slack: int = ROTATING_SLACK, step: int = CACHE_STEP):
        self.window, self.slack, self.step = window, slack, step
        self.offset = 0
        self.start = 0
        self.keys: mx.array | None = None
        self.values: mx.array | None = None

    @property
    def stored(self) -> int:
        return self.offset - self.start

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        length = keys.shape[2]
        if self.keys is None or self.stored + length > self.keys.shape[2]:
            self._compact(keys, length)
        begin = self.stored
        self.keys[..., begin : begin + length, :] = keys
        self.values[..., begin : begin + length, :] = values
        self.offset += length
        return self.keys[..., : self.stored, :], self.values[..., : self.stored, :]

    def _compact(self, new: mx.array, length: int) -> None:
        """Drop positions beyond the window and slack, and make room for `length` more plus a step."""
        keep = min(self.stored, self.window - 1 + self.slack)
        batch, heads, _, dims = new.shape
        kept = slice(self.stored - keep, self.stored)

        def with_room(stored: mx.array | None) -> mx.array:
            room = mx.zeros((batch, heads, length + self.step, dims), new.dtype)
            return room if stored is None else mx.concatenate([stored[..., kept, :], room], axis=2)

        self.keys, self.values = with_room(self.keys), with_room(self.values)
        self.start = self.offset - keep

    def mask(self, queries: int) -> mx.array | str | None:
        """The mask for the last `queries` positions written, over the keys the last update returned."""
        return window_mask(self.offset - queries, queries, self.start, self.stored, self.window)

    @property
    def trim_floor(self) -> int:
        """The earliest offset `trim` can go back to: where the next query's window still has every key it needs."""
        return 0 if self.start == 0 else min(self.offset, self.start + self.window - 1)

    def trim(self, n: int) -> int:
        """Forget up to the last n positions, but never so many that the next query's window reaches dropped
        positions; return how many were forgotten."""
        n = max(0, min(n, self.offset - self.trim_floor))
        self.offset -= n
        return n

    @property
    def state(self) -> RotatingState | None:
        """A snapshot of exactly the stored positions (None when empty); later updates do not change it."""
        if self.keys is None or self.offset == 0:
            return None
        return RotatingState(self.offset, self.start, self.keys[..., : self.stored, :], self.values[..., : self.stored, :])

    @state.setter
    def state(self, snapshot: RotatingState | None) -> None:
        if snapshot is None:
            self.offset, self.start, self.keys, self.values = 0, 0, None, None
        else:
            self.offset, self.start, self.keys, self.values = snapshot

    def snapshot(self, start: int = 0, end: int | None = None) -> RotatingState | None:
        """The whole state, copied: the buffer is written in place."""
        state = self.state
        if state is None:
            return None
        return state._replace(keys=mx.contiguous(state.keys), values=mx.contiguous(state.values))

    def restore(self, snapshot: RotatingState | None) -> None:
        self.state = snapshot

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes

    def batch(self) -> BatchKVCache:
        from plugd.nn.batch_cache import BatchKVCache

        return BatchKVCache(self.window, self.slack, self.step)
