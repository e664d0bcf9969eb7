"""A runner group's cache policy: each rank's own, made to agree with the others' where a prefill begins and pauses.

Every rank runs the same prefill chunks, since each chunk's forward pass meets
the other ranks' at its collectives. A chunk's bounds follow from where the
policy resumes and where it wants restore points (plugd.runner.prefill), and a
rank's policy decides both from its own caches: alike where the ranks hold
alike shares of every layer (tensor parallel), but not where each holds other
layers (a pipeline: one rank's layers may all trim back while another's are
recurrent and restore only at snapshots), nor where a byte budget evicts
different restore points on different ranks. So the ranks resume at the
earliest point any of them resumed at, and pause at the points any of them
wants.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plugd.runner.group import Group
from plugd.runner_api import RunnerCachePolicy


class AgreedPolicy:
    """`policy` (any RunnerCachePolicy), agreeing with the same policy on the group's other ranks."""

    def __init__(self, policy: RunnerCachePolicy, group: Group):
        self.policy, self.group = policy, group

    @property
    def layers(self) -> list[Any]:
        return self.policy.layers

    @property
    def tokens(self) -> list[int]:
        return self.policy.tokens

    @tokens.setter
    def tokens(self, tokens: list[int]) -> None:
        self.policy.tokens = tokens

    def resume(self, prompt: Sequence[int]) -> int:
        """Where every rank can resume: a rank ahead of the earliest resumes again, on the prompt cut there
        (which it may only reach short of), until all stand at the same point."""
        point = self.policy.resume(prompt)
        while len(points := set(self.group.gathered(point))) > 1:
            if point > (earliest := min(points)):
                point = self.policy.resume(prompt[: earliest + 1])
        return point

    def capture_points(self, start: int, end: int) -> Sequence[int]:
        return sorted(set().union(*self.group.gathered(list(self.policy.capture_points(start, end)))))

    def reserve(self, positions: int, expected: int = 0) -> None:
        self.policy.reserve(positions, expected)

    def prefilled(self) -> None:
        self.policy.prefilled()

    def finished(self) -> None:
        self.policy.finished()

    def adopt(self, layers: list[Any], tokens: list[int]) -> None:
        self.policy.adopt(layers, tokens)

    def reset(self) -> None:
        self.policy.reset()

    def stats(self) -> dict[str, int]:
        return self.policy.stats()
