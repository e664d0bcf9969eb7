"""What the engine is given between two of its steps: the completions that arrived, and the ones cancelled.

A runner takes its turns as they come (plugd.runner.server). In a group
(plugd.runner.group) the leader shares each turn with the followers before
taking it, so that every rank's engine gets the same inputs before the same
step: a cancellation counts from the turn that carries it, not from the moment
its client hung up.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
from PIL import Image

from plugd.protocol import Completion
from plugd.runner.generate import Engine
from plugd.runner.grammar import TokenMask
from plugd.runner.sequence import Emit


@attrs.frozen
class Arrival:
    """A completion as every rank gets it: numbered by the leader, with its prompt's cache keys and images."""

    number: int
    request: Completion
    keys: list[int]
    images: dict[int, Image.Image]


@attrs.frozen
class Turn:
    arrivals: tuple[Arrival, ...] = ()
    cancelled: frozenset[int] = frozenset()  # the numbers of completions cancelled since the turn before


# Where an arrival's events go, and its grammar's mask (None without one), on this rank.
Outlet = Callable[[Arrival], tuple[Emit, Callable[[], TokenMask] | None]]


class Player:
    """Hands an engine its turns: submits what arrived, and marks what was cancelled."""

    def __init__(self, engine: Engine, outlet: Outlet):
        self.engine = engine
        self._outlet = outlet
        self._cancelled: set[int] = set()

    def play(self, turn: Turn) -> None:
        self._cancelled |= turn.cancelled
        for arrival in turn.arrivals:
            emit, grammar = self._outlet(arrival)
            emit = self._forgetting(arrival.number, emit)
            try:
                self.engine.submit(arrival.request, emit, lambda n=arrival.number: n in self._cancelled, grammar,
                                   arrival.images, emit, arrival.keys)
            except Exception as exc:
                emit(exc)
                emit(None)

    def _forgetting(self, number: int, emit: Emit) -> Emit:
        def forward(event):
            if event is None:
                self._cancelled.discard(number)
            emit(event)

        return forward
