"""Drafters, which propose the next few tokens for the target model to verify (plugd.runner.speculative), and the
model that keeps a drafter's caches level with the target's.

A drafter's caches ride at the end of the model's cache list (`Drafted`), so the cache policies, which see one
list of caches, trim, snapshot and restore them with the rest, and every prefill chunk brings them along with the
target's: a prompt resumed from a restore point, or retried after a cancelled prefill, finds the draft exactly
where the target is. While a row decodes plainly (in a batch, or where drafting does not pay), a draft model
falls behind (it is `lazy`) and catches up from the tokens fed, in one pass, when it drafts again or when the
row's caches go back to the policy; a checkpoint's own multi-token-prediction head only keeps the target's
hidden states on every pass, and runs over them when it drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from plugd.constants import PREFILL_CHUNK
from plugd.nn.mtp import MTPCache, MTPDrafter, drafter


class DraftSession(Protocol):
    def propose(self, token: mx.array) -> mx.array:
        """Take one (1,) token, drafted or the row's pending one, and give the logits of the position after it,
        (vocab,), lazy."""

    def end(self, kept: int) -> None:
        """The round kept `kept` positions past the session's start (its first token and the drafted ones kept):
        the drafter's caches hold nothing past them."""


class Drafter(Protocol):
    kind: str  # what drafts, in a word or two: a status line says it
    weight_bytes: int  # what its parameters hold: next to the target's, what a drafted token costs
    wants_hidden: bool  # `follow` takes the target's final hidden states
    lazy: bool  # its caches may fall behind the target's in plain decode steps; `catch_up` brings them level

    def make_cache(self) -> list[Any]:
        """The drafter's caches, which follow the cache protocol (plugd.nn.cache) as the target's do."""

    def follow(self, tokens: mx.array, hidden: mx.array | None, cache: list[Any]) -> mx.array:
        """Bring `cache` along over `tokens` (batch, length), which the target has just been fed (and `hidden`,
        its final hidden states there, where the drafter wants them); lazy. What it returns is evaluated
        whenever the target's logits are, so the caches never fall behind."""

    def session(self, cache: list[Any], fed: Sequence[int]) -> DraftSession:
        """Drafting for one round, for a target whose caches hold the tokens `fed`."""

    def catch_up(self, cache: list[Any], fed: Sequence[int]) -> None:
        """Bring a lazy drafter's caches level with a target's that hold the tokens `fed`."""


class Checkpoint:
    """Where a list of caches stood, to go back to after a speculative forward pass: a layer that can trim back
    trims, one that cannot takes back a snapshot taken here."""

    def __init__(self, layers: list[Any]):
        self.offsets = [layer.offset for layer in layers]
        self._saved = [None if layer.trimmable else layer.snapshot() for layer in layers]

    def keep(self, layers: list[Any], positions: int) -> bool:
        """Bring each layer to `positions` past the checkpoint. When a layer cannot, every layer goes back to the
        checkpoint itself and False says that the kept positions must be fed again."""
        if all(layer.trim_floor <= start + positions for layer, start in zip(layers, self.offsets, strict=True)):
            for layer, start in zip(layers, self.offsets, strict=True):
                layer.trim(layer.offset - start - positions)
            return True
        for layer, start, saved in zip(layers, self.offsets, self._saved, strict=True):
            if layer.trimmable:
                layer.trim(layer.offset - start)
            else:
                layer.restore(saved)
        return False


class DraftModel:
    """A smaller model with the target's vocabulary drafts for it."""

    kind = "draft model"
    wants_hidden = False
    lazy = True

    def __init__(self, model: nn.Module):
        self.model = model
        self.weight_bytes = weight_bytes(model)

    def make_cache(self) -> list[Any]:
        return self.model.make_cache()

    def follow(self, tokens: mx.array, hidden: mx.array | None, cache: list[Any]) -> mx.array:
        return self.model(tokens, cache=cache)[:, -1]

    def session(self, cache: list[Any], fed: Sequence[int]) -> DraftSession:
        return _ModelSession(self.model, cache, fed[cache[0].offset :])

    def catch_up(self, cache: list[Any], fed: Sequence[int]) -> None:
        for start in range(cache[0].offset, len(fed), PREFILL_CHUNK):
            self.model(mx.array(fed[start : start + PREFILL_CHUNK], mx.int32)[None], cache=cache)
            mx.eval([layer.state for layer in cache])


class _ModelSession:
    """The tokens the draft fell behind by go in with the first one it is given."""

    def __init__(self, model: nn.Module, cache: list[Any], behind: Sequence[int]):
        self.model, self.cache, self.start = model, cache, Checkpoint(cache)
        self.behind, self.proposed = list(behind), 0

    def propose(self, token: mx.array) -> mx.array:
        tokens = mx.concatenate([mx.array(self.behind, mx.int32), token.reshape(1)]) if self.proposed == 0 and \
            self.behind else token.reshape(1)
        self.proposed += 1
        return self.model(tokens[None], cache=self.cache)[0, -1]

    def end(self, kept: int) -> None:
        # Where it cannot trim back (a recurrent draft), it goes back to the start and catches up next time.
        self.start.keep(self.cache, len(self.behind) + min(self.proposed, kept))


class HeadDraft:
    """A checkpoint's own multi-token-prediction head (plugd.nn.mtp) drafts for its model: the first token from
    the model's last hidden state and the row's pending token, each next one from the head's own hidden state
    and the token it drafted last."""

    kind = "mtp head"
    wants_hidden = True
    lazy = False

    def __init__(self, head: MTPDrafter, size: int):
        """`size`: the bytes the head's own layers hold."""
        self.head, self.weight_bytes = head, size

    def make_cache(self) -> list[Any]:
        return [MTPCache(self.head.make_cache())]

    def follow(self, tokens: mx.array, hidden: mx.array | None, cache: list[Any]) -> mx.array:
        return cache[0].store(hidden)

    def session(self, cache: list[Any], fed: Sequence[int]) -> DraftSession:
        (mtp,) = cache
        self._catch_up(mtp, fed)
        return _HeadSession(self.head, mtp)

    def catch_up(self, cache: list[Any], fed: Sequence[int]) -> None:
        """Nothing: the hidden states it drafts from are kept on every pass (the head runs over them lazily)."""

    def _catch_up(self, mtp: MTPCache, fed: Sequence[int]) -> None:
        """Run the head over the pairs (h_t, x_t+1) it has not seen, a prefill chunk at a time."""
        for start in range(mtp.head[0].offset, mtp.offset - 1, PREFILL_CHUNK):
            end = min(start + PREFILL_CHUNK, mtp.offset - 1)
            self.head(mtp.kept(start, end), mx.array(fed[start + 1 : end + 1], mx.int32)[None], mtp.head)


class _HeadSession:
    def __init__(self, head: MTPDrafter, mtp: MTPCache):
        self.head, self.mtp = head, mtp
        self.last = mtp.kept(mtp.offset - 1, mtp.offset)
        self.start = mtp.head[0].offset

    def propose(self, token: mx.array) -> mx.array:
        logits, hidden = self.head(self.last, token.reshape(1, 1), self.mtp.head)
        self.last = hidden[:, -1:]
        return logits[0, -1]

    def end(self, kept: int) -> None:
        # What it computed from its own hidden states is no good past the first: the next session starts over.
        for layer in self.mtp.head:
            layer.trim(layer.offset - self.start)


class Drafted:
    """The target model with a drafter: its caches are the target's followed by the drafter's, and each call runs
    both over the same tokens, returning the target's logits. Everything else is the target's."""

    def __init__(self, target: nn.Module, drafter: Drafter):
        self.target, self.drafter = target, drafter
        self.split = len(target.make_cache())

    def make_cache(self) -> list[Any]:
        return [*self.target.make_cache(), *self.drafter.make_cache()]

    def __call__(self, tokens: mx.array, cache: list[Any] | None = None, follow: bool = True, **kwargs: Any,
                 ) -> mx.array:
        """The target's logits; with `follow`, the drafter kept level over the same tokens."""
        if cache is None:
            return self.target(tokens, **kwargs)
        if not follow:
            return self.target(tokens, cache=self.own(cache), **kwargs)
        if self.drafter.wants_hidden:
            logits, hidden = self.target(tokens, cache=self.own(cache), return_hidden=True, **kwargs)
        else:
            logits, hidden = self.target(tokens, cache=self.own(cache), **kwargs), None
        return mx.depends(logits, self.drafter.follow(tokens, hidden, self.drafts(cache)))

    def decode(self, tokens: mx.array, cache: list[Any]) -> mx.array:
        """A plain decode step: a lazy drafter does not follow it."""
        return self(tokens, cache, follow=not self.drafter.lazy)

    def level(self, cache: list[Any], fed: Sequence[int]) -> None:
        """Bring the drafter's caches level with the target's, which hold the tokens `fed`."""
        self.drafter.catch_up(self.drafts(cache), fed)

    def own(self, cache: list[Any]) -> list[Any]:
        """The target's caches of a list `make_cache` made."""
        return cache[: self.split]

    def drafts(self, cache: list[Any]) -> list[Any]:
        """The drafter's caches of a list `make_cache` made."""
        return cache[self.split :]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


def drafter_of(model: nn.Module, draft: nn.Module | None) -> Drafter | None:
    """What drafts for `model`: its `draft` model, else its checkpoint's own multi-token-prediction head; None
    when it has neither."""
    if draft is not None:
        return DraftModel(draft)
    head = drafter(model)
    # Each drafted token also goes through the model's output head, which the head shares: as large as the embedding.
    return None if head is None else HeadDraft(head, weight_bytes(head.head) + weight_bytes(head.embed))


def weight_bytes(module: nn.Module) -> int:
    return sum(array.nbytes for _, array in tree_flatten(module.parameters()))
