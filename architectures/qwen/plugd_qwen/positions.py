"""Qwen3.5's rotary positions for text and images (multimodal RoPE), and the cache entry that keeps them per
sequence.

A text token's position is one number, the previous token's plus one, on all
three axes (time, row, column). An image of rows x columns merged patches
takes (p, p + row, p + column), p being where its first token would have
been, and the text after it goes on from p + max(rows, columns), not from
p + rows * columns: from each image on, a sequence's positions lag behind its
cache offset by another rows * columns - max(rows, columns). Each attention
head's rotary frequencies take turns among the axes (`MRoPE`).

`PositionCache`, the last entry of the model's cache list, records where the
lag grows. It follows the cache protocol (plugd.nn.cache) like any layer's
cache, so trimming back, restore points and batches keep every sequence's
positions right.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import mlx.core as mx
import numpy as np

from plugd.nn.rope import RoPE, rotate

TIME, ROW, COLUMN = 0, 1, 2


class PositionState(NamedTuple):
    """After `offset` positions: (offset, lag) where the lag grew, after each image, in order."""

    offset: int
    lags: tuple[tuple[int, int], ...]

    @property
    def position(self) -> int:
        """The position the next token takes."""
        return self.offset - (self.lags[-1][1] if self.lags else 0)


class PositionCache:
    spans = False
    trimmable = True
    trim_floor = 0

    def __init__(self, state: PositionState | None = None):
        self.offset, self.lags = state or (0, ())

    @property
    def position(self) -> int:
        return self.state.position

    def advance(self, length: int, lags: Sequence[tuple[int, int]] = ()) -> None:
        """`length` more positions; `lags`: (end, added lag) of each image among them, `end` counted from the
        first of them."""
        total = self.lags[-1][1] if self.lags else 0
        for end, added in lags:
            total += added
            self.lags += ((self.offset + end, total),)
        self.offset += length

    def trim(self, n: int) -> int:
        n = min(n, self.offset)
        self.offset -= n
        self.lags = tuple(lag for lag in self.lags if lag[0] <= self.offset)
        return n

    @property
    def state(self) -> PositionState:
        return PositionState(self.offset, self.lags)

    @state.setter
    def state(self, state: PositionState | None) -> None:
        self.offset, self.lags = state or (0, ())

    def snapshot(self, start: int = 0, end: int | None = None) -> PositionState:
        return self.state

    def restore(self, snapshot: PositionState | None) -> None:
        self.state = snapshot

    @property
    def nbytes(self) -> int:
        return 0

    def batch(self) -> BatchPositionCache:
        return BatchPositionCache()


class BatchPositionCache:
    """The position caches of a batch's rows; a batch decodes text only, so its lags stay as they joined."""

    def __init__(self):
        self.states: list[PositionState] = []

    def extend(self, caches: Sequence[PositionCache], limits: Sequence[int] = ()) -> None:
        self.states += [cache.state for cache in caches]

    def keep(self, rows: Sequence[int]) -> None:
        self.states = [self.states[r] for r in rows]

    def row(self, r: int) -> PositionCache:
        return PositionCache(self.states[r])

    def advance(self, length: int, lags: Sequence[tuple[int, int]] = ()) -> None:
        if lags:
            raise ValueError("a batch decodes text only")
        self.states = [PositionState(offset + length, lags) for offset, lags in self.states]

    @property
    def position(self) -> mx.array:
        """Each row's next position, (rows,)."""
        return mx.array([state.position for state in self.states], mx.int32)

    @property
    def nbytes(self) -> int:
        return 0


def chunk_positions(first: int, length: int, images: Sequence[tuple[int, int, int]]
                    ) -> tuple[mx.array, list[tuple[int, int]]]:
    """The (3, length) positions of a chunk whose first token takes position `first` and which holds `images`,
    (start in the chunk, rows, columns) each; and each image's (end in the chunk, added lag)."""
    positions = np.empty((3, length), np.int32)
    lags, done, p = [], 0, first
    for start, rows, columns in sorted(images):
        positions[:, done:start] = p + np.arange(start - done)
        p += start - done
        end = start + rows * columns
        positions[TIME, start:end] = p
        positions[ROW, start:end] = p + np.repeat(np.arange(rows), columns)
        positions[COLUMN, start:end] = p + np.tile(np.arange(columns), rows)
        lags.append((end, rows * columns - max(rows, columns)))
        p, done = p + max(rows, columns), end
    positions[:, done:] = p + np.arange(length - done)
    return mx.array(positions), lags


@dataclass(frozen=True)
class MRoPE:
    """RoPE over the first `dims` features whose frequencies take their positions in turn from the row axis
    (frequencies 1, 4, 7, ..., `sections[1]` of them), the column axis (2, 5, 8, ..., `sections[2]`) and the
    time axis (the rest). Given an offset (an int, or a batch's (rows,) array), every axis is at that position
    and it is plain RoPE; given (3, length) positions, each token takes its own."""

    dims: int
    base: float
    sections: tuple[int, ...]

    def __call__(self, x: mx.array, position: int | mx.array) -> mx.array:
        if not (isinstance(position, mx.array) and position.ndim == 2):
            return RoPE(self.dims, self.base)(x, position)
        return rotate(x, self.angles(position))

    def angles(self, positions: mx.array) -> mx.array:
        """(length, dims / 2) angles for (3, length) positions."""
        count = self.dims // 2
        index = np.arange(count)
        axis = np.full(count, TIME)
        axis[(index % 3 == 1) & (index < 3 * self.sections[ROW])] = ROW
        axis[(index % 3 == 2) & (index < 3 * self.sections[COLUMN])] = COLUMN
        inverse = 1.0 / self.base ** (mx.arange(0, self.dims, 2, dtype=mx.float32) / self.dims)
        return positions[mx.array(axis)].T.astype(mx.float32) * inverse
