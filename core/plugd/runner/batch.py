"""The sequences decoding together: one row each in the model's batch caches (plugd.nn.batch_cache)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from plugd.runner.sequence import Sequence


class Batch:
    """With `alone`, at most one row at a time (the daemon sends one completion at a time): the row decodes in the
    policy's own caches, taken and given back as they are, copying nothing."""

    def __init__(self, model: nn.Module, alone: bool = False):
        self.model = model
        self.alone = alone
        self.rows: list[Sequence] = []
        self.layers: list[Any] | None = None

    def join(self, sequence: Sequence, caches: list[Any]) -> None:
        """Add a row continuing `caches` (one per layer, as the cache policy holds them; copied, not taken)."""
        if self.alone:
            if self.rows:
                raise RuntimeError("a batch of one already has its row")
            self.layers = caches
            self.rows.append(sequence)
            return
        if self.layers is None:
            self.layers = [cache.batch() for cache in caches]
        limit = len(sequence.prompt.tokens) + max(sequence.budget, 0) + 1
        for layer, cache in zip(self.layers, caches, strict=True):
            layer.extend([cache], [limit])
        self.rows.append(sequence)

    def leave(self, leaving: Collection[Sequence]) -> list[tuple[Sequence, list[Any]]]:
        """Drop the rows of `leaving`; return each with its caches, copied out of the batch."""
        if not leaving:
            return []
        if self.alone:
            out = [(self.rows[0], self.layers)]
            self.clear()
            return out
        gone = [(i, s) for i, s in enumerate(self.rows) if s in leaving]
        out = [(s, [layer.row(i) for layer in self.layers]) for i, s in gone]
        kept = [i for i, s in enumerate(self.rows) if s not in leaving]
        for layer in self.layers:
            layer.keep(kept)
        self.rows = [self.rows[i] for i in kept]
        if not self.rows:
            self.layers = None
        return out

    def clear(self) -> None:
        self.rows, self.layers = [], None

    def forward(self, tokens: mx.array) -> mx.array:
        """Each row's next-token logits, (rows, vocab), after feeding it its token of `tokens` (rows,); lazy."""
        return self.model(tokens[:, None], cache=self.layers)[:, -1]

    @property
    def nbytes(self) -> int:
        """What the rows' caches hold beyond the policy's (a batch of one holds those)."""
        return 0 if self.alone else sum(layer.nbytes for layer in self.layers or ())
