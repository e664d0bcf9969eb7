"""Caches of several sequences decoded together, one batch row each, whatever their offsets.

A decode step feeds every row one token, so each row's newest position lands in the same column: rows are
right-aligned, and a row that holds fewer positions than the longest has padding columns before its first,
which the attention mask hides. Each row keeps its own offset (`offset` is a (rows,) array, which RoPE takes
as each row's position). A single-sequence cache (plugd.nn.cache) gives the empty batch cache for its kind
(`batch()`); rows are added by `extend`, dropped by `keep`, and copied back out into a single-sequence cache
by `row`, so a finished sequence's positions go back to the cache policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from plugd.constants import CACHE_STEP, DECODE_HEADROOM, ROTATING_SLACK
from plugd.nn.cache import KVCache, KVSpan
from plugd.nn.recurrent import RecurrentCache, RecurrentState
from plugd.nn.rotating import RotatingKVCache, RotatingState


def _steps(positions: int, step: int) -> int:
    return -(-positions // step) * step


class _Rows:
    """What every batch cache keeps per row: the positions it has seen."""

    offsets: list[int]

    @property
    def offset(self) -> mx.array:
        """Each row's offset, (rows,): the position its next token takes (what RoPE is given)."""
        return mx.array(self.offsets, mx.int32)

    @property
    def rows(self) -> int:
        return len(self.offsets)


class BatchKVCache(_Rows):
    """Keys and values of several rows, (rows, kv_heads, columns, head_dim), right-aligned at column `end - 1`.

    Row r's positions occupy columns `pads[r]` .. `end - 1`. With a `window` (a sliding-window layer), only
    what a query can still see is kept: when the buffer is full, all but the last `window - 1 + slack` columns
    are dropped. `limits[r]` is the most positions row r may reach (its context), which growth stops at.
    """

    def __init__(self, window: int | None = None, slack: int = ROTATING_SLACK, step: int = CACHE_STEP):
        self.window, self.slack, self.step = window, slack, step
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.end = 0
        self.pads: list[int] = []
        self.offsets: list[int] = []
        self.limits: list[int] = []

    def extend(self, caches: Sequence[Any], limits: Sequence[int]) -> None:
        """Add a row continuing each of `caches` (KVCache or RotatingKVCache), which may each reach `limits`."""
        parts = [self._stored(cache) for cache in caches]
        end = max([self.end, *(0 if keys is None else keys.shape[2] for keys, _ in parts)])
        shape = self._shape(parts)
        if shape is None:  # nothing stored anywhere yet: the first write sizes the buffer
            self.pads += [0] * len(parts)
        else:
            heads, dims, dtype = shape
            offsets = [*self.offsets, *(cache.offset for cache in caches)]
            capacity = self._capacity(end, end + 1, [*self.limits, *limits], offsets, DECODE_HEADROOM)
            grown = self._shifted(end, capacity, shape)
            rows = [self._placed(part, end, capacity, shape) for part in parts]
            self.keys = mx.concatenate([grown[0], *(keys for keys, _ in rows)]) if grown else mx.concatenate(
                [keys for keys, _ in rows])
            self.values = mx.concatenate([grown[1], *(values for _, values in rows)]) if grown else mx.concatenate(
                [values for _, values in rows])
            self.pads = [pad + end - self.end for pad in self.pads]
            self.pads += [end - (0 if keys is None else keys.shape[2]) for keys, _ in parts]
        self.end = end
        self.offsets += [cache.offset for cache in caches]
        self.limits += list(limits)

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only `rows`, in that order; padding columns no row needs any more are dropped."""
        self.pads, self.offsets, self.limits = ([values[r] for r in rows] for values in
                                                (self.pads, self.offsets, self.limits))
        if not rows:
            self.keys = self.values = None
            self.end = 0
        elif self.keys is not None:
            index = mx.array(list(rows))
            first = min(self.pads)
            self.keys = self.keys[index, :, first:]
            self.values = self.values[index, :, first:]
            self.pads = [pad - first for pad in self.pads]
            self.end -= first

    def row(self, r: int) -> KVCache | RotatingKVCache:
        """Row r as a single-sequence cache of its own (its positions copied)."""
        keys = None if self.keys is None or self.pads[r] >= self.end else (
            mx.contiguous(self.keys[r : r + 1, :, self.pads[r] : self.end]),
            mx.contiguous(self.values[r : r + 1, :, self.pads[r] : self.end]))
        if self.window is None:
            cache = KVCache(self.step)
            if keys is not None:
                cache.restore(KVSpan(*keys))
            return cache
        cache = RotatingKVCache(self.window, self.slack, self.step)
        if keys is not None:
            cache.state = RotatingState(self.offsets[r], self.offsets[r] - keys[0].shape[2], *keys)
        return cache

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Append each row's new positions (the same count for every row) in the columns after `end`."""
        length = keys.shape[2]
        if self.keys is None or self.end + length > self.keys.shape[2]:
            self._make_room(keys, length)
        self.keys[..., self.end : self.end + length, :] = keys
        self.values[..., self.end : self.end + length, :] = values
        self.end += length
        self.offsets = [offset + length for offset in self.offsets]
        return self.keys[..., : self.end, :], self.values[..., : self.end, :]

    def mask(self, queries: int) -> mx.array | str | None:
        """Which of the keys the last update returned each row's last `queries` positions may see: none of its
        padding, nothing later than itself, and within the window if there is one."""
        first_query = self.end - queries
        window_cut = self.window is not None and first_query - self.window + 1 > 0
        if max(self.pads, default=0) == 0 and not window_cut:
            return "causal" if queries > 1 else None
        columns = mx.arange(self.end)[None]
        query_columns = mx.arange(first_query, self.end)[:, None]
        visible = columns <= query_columns
        if self.window is not None:
            visible = visible & (columns > query_columns - self.window)
        real = columns >= mx.array(self.pads)[:, None]  # (rows, columns)
        return visible[None, None] & real[:, None, None, :]

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes

    def _stored(self, cache: Any) -> tuple[mx.array | None, mx.array | None]:
        """A single cache's stored positions, the newest last, as (keys, values) views; (None, None) if empty."""
        state = cache.state
        if state is None:
            return None, None
        keys, values = state[-2:]
        if self.window is not None:  # a sliding window needs only what its next query sees
            kept = min(keys.shape[2], self.window - 1 + self.slack)
            keys, values = keys[..., keys.shape[2] - kept :, :], values[..., values.shape[2] - kept :, :]
        return keys, values

    def _shape(self, parts: list[tuple[mx.array | None, mx.array | None]]) -> tuple[int, int, Any] | None:
        """(kv_heads, head_dim, dtype) of the stored keys, from this cache or the rows being added."""
        sample = self.keys if self.keys is not None else next((keys for keys, _ in parts if keys is not None), None)
        return None if sample is None else (sample.shape[1], sample.shape[3], sample.dtype)

    def _capacity(self, end: int, needed: int, limits: Sequence[int], offsets: Sequence[int], ahead: int = 0) -> int:
        """Columns for a buffer that must hold `needed`: doubling from the current size, or `ahead` columns past
        `end` when rows join (so that decoding writes in place), but no further than the rows' limits reach (or a
        window keeps)."""
        if self.window is not None:
            return _steps(needed + self.step, self.step)
        current = 0 if self.keys is None else self.keys.shape[2]
        reach = max((end + limit - offset for limit, offset in zip(limits, offsets)), default=needed)
        wanted = max(2 * current, end + ahead)
        return max(_steps(needed, self.step), min(_steps(wanted, self.step), _steps(reach, self.step)))

    def _shifted(self, end: int, capacity: int, shape: tuple[int, int, Any]) -> tuple[mx.array, mx.array] | None:
        """The existing rows moved right by `end - self.end` columns, in a buffer of `capacity` columns."""
        if self.keys is None:
            if not self.offsets:
                return None
            return tuple(mx.zeros((len(self.offsets), shape[0], capacity, shape[1]), shape[2]) for _ in range(2))
        shift = end - self.end

        def moved(stored: mx.array) -> mx.array:
            rows, heads, _, dims = stored.shape
            return mx.concatenate([mx.zeros((rows, heads, shift, dims), stored.dtype), stored[..., : self.end, :],
                                   mx.zeros((rows, heads, capacity - end, dims), stored.dtype)], axis=2)

        return moved(self.keys), moved(self.values)

    @staticmethod
    def _placed(part: tuple[mx.array | None, mx.array | None], end: int, capacity: int,
                shape: tuple[int, int, Any]) -> tuple[mx.array, mx.array]:
        """One new row's keys and values, right-aligned at column `end - 1` in `capacity` columns."""
        heads, dims, dtype = shape

        def placed(stored: mx.array | None) -> mx.array:
            length = 0 if stored is None else stored.shape[2]
            pieces = [mx.zeros((1, heads, end - length, dims), dtype)]
            pieces += [] if stored is None else [stored.astype(dtype)]
            return mx.concatenate([*pieces, mx.zeros((1, heads, capacity - end, dims), dtype)], axis=2)

        return placed(part[0]), placed(part[1])

    def _make_room(self, new: mx.array, length: int) -> None:
        rows, heads, _, dims = new.shape
        keep = self.end if self.window is None else min(self.end, self.window - 1 + self.slack)
        drop = self.end - keep
        capacity = self._capacity(keep, keep + length, self.limits, self.offsets)

        def moved(stored: mx.array | None) -> mx.array:
            room = mx.zeros((rows, heads, capacity - keep, dims), new.dtype)
            return room if stored is None else mx.concatenate([stored[..., drop : self.end, :], room], axis=2)

        self.keys, self.values = moved(self.keys), moved(self.values)
        self.pads = [max(pad - drop, 0) for pad in self.pads]
        self.end = keep


class BatchRecurrentCache(_Rows):
    """The short-convolution windows, (rows, kernel - 1, channels), and recurrent states of several rows.

    A row that has seen nothing yet holds zeros, which is what a recurrent layer starts from.
    """

    def __init__(self):
        self.conv: mx.array | None = None
        self.recurrent: mx.array | None = None
        self.offsets: list[int] = []

    def advance(self, conv: mx.array, recurrent: mx.array, positions: int) -> None:
        self.conv, self.recurrent = conv, recurrent
        self.offsets = [offset + positions for offset in self.offsets]

    def extend(self, caches: Sequence[Any], limits: Sequence[int] = ()) -> None:
        states = [cache.state for cache in caches]
        sample = self.conv if self.conv is not None else next((s.conv for s in states if s is not None), None)
        if sample is not None:
            template = (self.conv, self.recurrent) if self.conv is not None else next(
                (s.conv, s.recurrent) for s in states if s is not None)
            zeros = tuple(mx.zeros((1, *array.shape[1:]), array.dtype) for array in template)
            existing = [] if not self.offsets else [(self.conv, self.recurrent) if self.conv is not None else tuple(
                mx.zeros((len(self.offsets), *z.shape[1:]), z.dtype) for z in zeros)]
            added = [zeros if s is None else (s.conv, s.recurrent) for s in states]
            self.conv = mx.concatenate([conv for conv, _ in [*existing, *added]])
            self.recurrent = mx.concatenate([recurrent for _, recurrent in [*existing, *added]])
        self.offsets += [cache.offset for cache in caches]

    def keep(self, rows: Sequence[int]) -> None:
        self.offsets = [self.offsets[r] for r in rows]
        if self.conv is not None:
            index = mx.array(list(rows)) if rows else None
            self.conv = None if index is None else self.conv[index]
            self.recurrent = None if index is None else self.recurrent[index]

    def row(self, r: int) -> RecurrentCache:
        cache = RecurrentCache()
        if self.offsets[r] and self.conv is not None:
            cache.state = RecurrentState(self.offsets[r], self.conv[r : r + 1], self.recurrent[r : r + 1])
        return cache

    @property
    def nbytes(self) -> int:
        return 0 if self.conv is None else self.conv.nbytes + self.recurrent.nbytes
