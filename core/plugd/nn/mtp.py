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
computed its hidden states for them), the drafter's cache goes back to where the drafting began (`trim`) and the
drafter runs over the model's hidden states of the accepted positions, as over a prompt chunk, which also drafts
the next first token.

Fed as a draft model is, chunk by chunk with the tokens the model was fed, the head pairs each call's first token
with the model's last hidden state of the call before (kept from it), then each hidden state with the token after
it, so its cache runs one position behind the model's; asked for the token after one more, it pairs the last
hidden state it kept with that token.
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
