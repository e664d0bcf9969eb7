"""The sequences decoding together: one row each in the model's batch caches (plugd.nn.batch_cache)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from plugd.runner.sequence import Sequence


class Batch:
    """With `alone`, at most one row at a time (the daemon sends one completion at a time): the row decodes in the
    policy's own caches, taken and given back as they are, copying nothing. A batch whose lone row decodes
    speculatively holds that row's caches as single-sequence ones (`solo`) until another row joins."""

    def __init__(self, model: nn.Module, alone: bool = False,
                 step: Callable[[mx.array, list[Any]], mx.array] | None = None):
        """`step(tokens, caches)`: a decode step's forward pass (the model's call, unless it decodes otherwise)."""
        self.model = model
        self._step = step or (lambda tokens, caches: model(tokens, cache=caches))
        self.alone = alone
        self.rows: list[Sequence] = []
        self.layers: list[Any] | None = None
        self._solo = False

    def join(self, sequence: Sequence, caches: list[Any]) -> None:
        """Add a row continuing `caches` (one per layer, as the cache policy holds them; copied, not taken)."""
        if self.alone:
            if self.rows:
                raise RuntimeError("a batch of one already has its row")
            self.layers = caches
            self.rows.append(sequence)
            return
        if self._solo:  # back into batch caches, beside the new row
            self.layers, self._solo = self._batched(self.rows[0], self.layers), False
        self.layers = self._batched(sequence, caches, self.layers)
        self.rows.append(sequence)

    def solo(self) -> list[Any]:
        """The lone row's caches as single-sequence ones (plugd.nn.cache), which trim and restore as a speculative
        round needs; they stay so until another row joins."""
        if not (self.alone or self._solo):
            if len(self.rows) != 1:
                raise RuntimeError("only a lone row decodes in single-sequence caches")
            self.layers = [layer.row(0) for layer in self.layers]
            self._solo = True
        return self.layers

    @staticmethod
    def _batched(sequence: Sequence, caches: list[Any], layers: list[Any] | None = None) -> list[Any]:
        """`layers` (new batch caches when None) with a row continuing `caches` for `sequence` added."""
        layers = layers or [cache.batch() for cache in caches]
        limit = len(sequence.prompt.tokens) + max(sequence.budget, 0) + 1
        for layer, cache in zip(layers, caches, strict=True):
            layer.extend([cache], [limit])
        return layers

    def leave(self, leaving: Collection[Sequence]) -> list[tuple[Sequence, list[Any]]]:
        """Drop the rows of `leaving`; return each with its caches, copied out of the batch."""
        if not leaving:
            return []
        if self.alone or self._solo:
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
        self.rows, self.layers, self._solo = [], None, False

    def forward(self, tokens: mx.array) -> mx.array:
        """Each row's next-token logits, (rows, vocab), after feeding it its token of `tokens` (rows,); lazy."""
        return self._step(tokens[:, None], self.layers)[:, -1]

    @property
    def nbytes(self) -> int:
        """What the rows' caches hold beyond the policy's (a batch of one holds those)."""
        return 0 if self.alone else sum(layer.nbytes for layer in self.layers or ())  # solo ones are its own
