"""Multi-token prediction: a head some checkpoints carry beside their model (Qwen3-Next's and Qwen3.5's `mtp.*`)
that drafts the token after next for the model itself, for speculative decoding.

An architecture whose checkpoints may carry one gives its Model

- `model(tokens, cache, ..., return_hidden=True) -> (logits, hidden)`: `hidden` (batch, length, hidden size) the
  final hidden states the logits are computed from; without `return_hidden`, the call is unchanged;
- `model.drafter() -> MTPDrafter | None`: the head, None when the checkpoint has none.

An MTPDrafter takes the model's hidden states at positions t and the tokens at t + 1 and returns the logits for the
tokens at t + 2, and its own hidden states, which it takes back in place of the model's to draft further. Its
`make_cache()` list (a KVCache per layer: plugd.nn.cache, so batching and the prefix cache keep it) advances one
position per pair, so it is level with the model's when the engine runs it over each prompt chunk's hidden states
and the chunk's tokens shifted by one, the last paired with the token sampled after the chunk:

    logits, hidden = model(prompt, cache, return_hidden=True)                # positions 0 .. n-1
    token = sample(logits[:, -1:])                                           # x_n, (batch, 1)
    draft = model.drafter()
    logits, h = draft(hidden, concat([prompt[:, 1:], token], 1), draft_cache)  # pairs (h_t, x_t+1), t < n
    first = argmax(logits[:, -1:])                                           # drafts x_n+1
    logits, h = draft(h[:, -1:], first, draft_cache)                         # drafts x_n+2, and so on

Drafts past the first pair the head's own hidden state with its own draft. Once the model has checked them (and
computed its hidden states for them), the head's cache goes back to where the drafting began (`trim`), and the
next round first runs the head over the model's hidden states of the positions kept, as over a prompt chunk.

The runner (plugd.runner.drafting) does not run the head on every forward pass: `MTPCache` keeps the model's
hidden states as the positions go by, and the head catches up on them when it drafts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn
from attrs import frozen

from plugd.nn.cache import KVCache


class MTPDrafter(Protocol):
    def __call__(self, hidden: mx.array, tokens: mx.array, cache: list[Any] | None = None,
                 position: int | mx.array | None = None) -> tuple[mx.array, mx.array]:
        """(logits for the tokens at t + 2, hidden states) from the hidden states at positions t and the token ids
        (batch, length) at t + 1, advancing `cache`; `position`: what the rotary embedding takes for the first
        (the cache's offset when None)."""

    def make_cache(self) -> list[Any]: ...


@frozen
class HeadDrafter:
    """An MTPDrafter from a head module (`head(hidden, embedded, cache, position) -> hidden`, `head.make_cache()`) and
    the model's own embedding and output head, which the head shares."""

    head: nn.Module
    embed: Callable[[mx.array], mx.array]
    logits: Callable[[mx.array], mx.array]

    def __call__(self, hidden: mx.array, tokens: mx.array, cache: list[KVCache] | None = None,
                 position: int | mx.array | None = None) -> tuple[mx.array, mx.array]:
        out = self.head(hidden, self.embed(tokens), cache, position)
        return self.logits(out), out

    def make_cache(self) -> list[KVCache]:
        return self.head.make_cache()


def drafter(model: nn.Module) -> MTPDrafter | None:
    """The model's own multi-token-prediction drafter; None when its architecture or checkpoint has none."""
    make = getattr(model, "drafter", None)
    return make() if make is not None else None


def drop_head(model: nn.Module) -> None:
    """Take the model's multi-token-prediction head (a HeadDrafter's) out of it, before its weights are evaluated,
    so that they are never read: for a runner group, which decodes without drafting."""
    head = getattr(drafter(model), "head", None)
    for path, module in model.named_modules():
        if module is head:
            *owners, name = path.split(".")
            owner = model
            for key in owners:
                owner = owner[int(key)] if isinstance(owner, list) else owner[key]
            owner.pop(name)
            return


class MTPCache:
    """A multi-token-prediction head's caches beside the model's, level with them for the cache protocol.

    `hidden` keeps the model's final hidden states, one per position (split in halves as the keys and values of a
    one-head KV cache, so it trims, spans and batches as one), and every forward pass of the model brings it
    along. The head's own key/value caches (`head`) hold one entry per pair (h_t, x_t+1), so at most one fewer
    than the positions; they are brought up to date only when the head drafts (`catch_up`), from the hidden
    states kept and the tokens fed. So the cache protocol sees only `hidden`: a span restored from a snapshot
    is recomputed for the head from the hidden states it brings, the next time it drafts.
    """

    spans = True
    trimmable = True

    def __init__(self, head: list[KVCache], hidden: KVCache | None = None):
        self.head = head
        self.hidden = hidden or KVCache()

    @property
    def offset(self) -> int:
        return self.hidden.offset

    @property
    def trim_floor(self) -> int:
        return 0

    def store(self, hidden: mx.array) -> mx.array:
        """Keep the model's final hidden states, (batch, length, size), of the positions it was just fed."""
        return _stored(self.hidden, hidden)

    def kept(self, start: int, end: int) -> mx.array:
        """The hidden states of positions [start, end), (1, end - start, size)."""
        keys, values = self.hidden.state
        return mx.concatenate([keys[:, 0, start:end], values[:, 0, start:end]], axis=-1)

    def trim(self, n: int) -> int:
        n = self.hidden.trim(n)
        for layer in self.head:
            layer.trim(max(layer.offset - max(self.offset - 1, 0), 0))
        return n

    @property
    def state(self) -> Any:
        return self.hidden.state, [layer.state for layer in self.head]

    def snapshot(self, start: int = 0, end: int | None = None) -> Any:
        return self.hidden.snapshot(start, end)

    def restore(self, snapshot: Any) -> None:
        self.hidden.restore(snapshot)

    @property
    def nbytes(self) -> int:
        return self.hidden.nbytes + sum(layer.nbytes for layer in self.head)

    def batch(self) -> BatchMTPCache:
        return BatchMTPCache(self.hidden.batch())


class BatchMTPCache:
    """MTPCaches of the rows of a batch: the hidden states batched (a batch KV cache), each row's head caches set
    aside as they were, since a head drafts only for a row that decodes alone."""

    def __init__(self, hidden: Any):
        self.hidden = hidden
        self.heads: list[list[KVCache]] = []

    @property
    def offset(self) -> mx.array:
        return self.hidden.offset

    def store(self, hidden: mx.array) -> mx.array:
        return _stored(self.hidden, hidden)

    def extend(self, caches: list[MTPCache], limits: list[int]) -> None:
        self.hidden.extend([cache.hidden for cache in caches], limits)
        self.heads += [cache.head for cache in caches]

    def keep(self, rows: list[int]) -> None:
        self.hidden.keep(rows)
        self.heads = [self.heads[r] for r in rows]

    def row(self, r: int) -> MTPCache:
        return MTPCache(self.heads[r], self.hidden.row(r))

    @property
    def nbytes(self) -> int:
        return self.hidden.nbytes + sum(layer.nbytes for head in self.heads for layer in head)


def _stored(cache: Any, hidden: mx.array) -> mx.array:
    """`hidden`, (batch, length, size), appended to a one-head key/value `cache` as its two halves; lazy."""
    half = hidden.shape[-1] // 2
    keys, _ = cache.update_and_fetch(hidden[:, None, :, :half], hidden[:, None, :, half:])
    return keys
