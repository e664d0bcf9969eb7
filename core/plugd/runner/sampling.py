"""Choosing the next token from the model's logits, as llama.cpp and Ollama do.

Order: a grammar's mask, if any, then repetition penalties over the recent
tokens, then (unless greedy) the top-k, top-p and min-p filters on the
penalised distribution, then the temperature and a categorical draw.
Temperature 0 is greedy: the argmax of the penalised logits.

Everything stays lazy (MLX arrays, no reads), so the next decode step can be
dispatched before this token is known.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import mlx.core as mx

from plugd.protocol import SamplingParams

NEGATIVE_INFINITY = float("-inf")


def apply_penalties(logits: mx.array, recent: mx.array, params: SamplingParams) -> mx.array:
    """Penalise tokens that occur in `recent`, llama.cpp's way.

    The repeat penalty divides a positive logit and multiplies a negative one
    (both make the token less likely); the presence penalty is subtracted once
    per seen token, the frequency penalty once per occurrence.
    """
    counts = mx.zeros(logits.shape, mx.float32).at[recent].add(1.0)
    seen = counts > 0
    if params.repeat_penalty != 1.0:
        penalised = mx.where(logits > 0, logits / params.repeat_penalty, logits * params.repeat_penalty)
        logits = mx.where(seen, penalised, logits)
    return logits - params.frequency_penalty * counts - params.presence_penalty * seen


def filter_logits(logits: mx.array, params: SamplingParams) -> mx.array:
    """Set the logits of tokens that top-k, top-p or min-p rule out to -inf, over the last axis (a position, or a
    row of them); the likeliest token always stays."""
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        ruled_out = mx.argpartition(-logits, kth=params.top_k - 1, axis=-1)[..., params.top_k :]
        logits = mx.put_along_axis(logits, ruled_out, mx.array(NEGATIVE_INFINITY, logits.dtype), axis=-1)
    if params.top_p < 1.0:
        order = mx.argsort(-logits, axis=-1)
        probs = mx.softmax(mx.take_along_axis(logits, order, axis=-1), axis=-1)
        mass_before = mx.cumsum(probs, axis=-1) - probs
        keep_sorted = (mass_before < params.top_p) | (mx.arange(vocab) == 0)
        keep = mx.put_along_axis(mx.zeros(logits.shape, mx.bool_), order, keep_sorted, axis=-1)
        logits = mx.where(keep, logits, NEGATIVE_INFINITY)
    if params.min_p > 0.0:
        # p >= min_p * p_max  <=>  logit >= max logit + log(min_p)
        logits = mx.where(logits >= logits.max(axis=-1, keepdims=True) + math.log(params.min_p), logits,
                          NEGATIVE_INFINITY)
    return logits


class Sampler:
    """Draws one token per call for one generation, remembering the recent tokens its penalties need."""

    def __init__(self, params: SamplingParams, context: Sequence[int], num_ctx: int):
        self.params = params
        self._window = params.penalty_window(num_ctx) if params.penalizes else 0
        self._recent = mx.array(list(context[-self._window :]) if self._window else [], mx.int32)
        seed = params.seed if params.seed is not None and params.seed >= 0 else random.getrandbits(63)
        self._key = mx.random.key(seed)

    def __call__(self, logits: mx.array, allowed: mx.array | None = None) -> tuple[mx.array, mx.array]:
        """(token id as an int32 scalar, log-probabilities over the vocabulary), both lazy.

        `allowed` (booleans over the vocabulary) is a grammar's mask: every other
        token gets probability 0 before anything else, so penalties, filters and
        log-probabilities all see the masked distribution. The log-probabilities
        are those of the masked, penalised distribution, before the filters and
        the temperature: what the model, with penalties, thinks of each token.
        """
        logprobs, scores = self._processed(logits, self._recent, allowed)
        token = self.choose(scores)
        self.advance(token[None])
        return token, logprobs

    def positions(self, logits: mx.array, following: mx.array, allowed: mx.array | None = None,
                  ) -> tuple[mx.array, mx.array]:
        """For the logits of n positions in a row, (n, vocab), the first of which comes next and each later one
        after one more token of `following` (n - 1 tokens, not yet drawn as far as this sampler knows): each
        position's log-probabilities, as `__call__` gives them, and its scores (`choose`), both (n, vocab) and
        lazy. `allowed`: each position's grammar mask, (n, vocab)."""
        if not self._window:  # nothing depends on the tokens before: every position at once
            return self._processed(logits, self._recent, allowed)
        scored = [self.scored(logits[i], following[:i], None if allowed is None else allowed[i])
                  for i in range(logits.shape[0])]
        return mx.stack([logprobs for logprobs, _ in scored]), mx.stack([scores for _, scores in scored])

    def scored(self, logits: mx.array, following: mx.array, allowed: mx.array | None = None,
               ) -> tuple[mx.array, mx.array]:
        """One position's log-probabilities and scores, (vocab,) each, lazy: the position after `following`, tokens
        not yet drawn as far as this sampler knows; `allowed`, its grammar mask."""
        recent = self._recent
        if self._window and following.size:
            recent = mx.concatenate([recent, following.astype(mx.int32)])[-self._window :]
        return self._processed(logits, recent, allowed)

    def choose(self, scores: mx.array) -> mx.array:
        """The token drawn from one position's scores: their argmax when greedy, else a draw from their softmax;
        an int32 scalar, lazy."""
        if self.params.greedy:
            return mx.argmax(scores).astype(mx.int32)
        return mx.random.categorical(scores, key=self.next_key()).astype(mx.int32)

    def next_key(self) -> mx.array:
        """A fresh random key from the generation's stream (seeded when the request names a seed)."""
        self._key, key = mx.random.split(self._key)
        return key

    def advance(self, tokens: mx.array) -> None:
        """The penalties count `tokens` (drawn elsewhere, as verifying drafted tokens does) from now on."""
        if self._window:
            self._recent = mx.concatenate([self._recent, tokens.astype(mx.int32)])[-self._window :]

    def _processed(self, logits: mx.array, recent: mx.array, allowed: mx.array | None) -> tuple[mx.array, mx.array]:
        """One position's log-probabilities and scores: its logits masked and penalised, then (unless greedy)
        filtered and divided by the temperature."""
        logits = logits.astype(mx.float32)
        if allowed is not None:
            logits = mx.where(allowed, logits, NEGATIVE_INFINITY)
        if self._window and recent.size:
            logits = apply_penalties(logits, recent, self.params)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if self.params.greedy:
            return logprobs, logits
        return logprobs, filter_logits(logits, self.params) / self.params.temperature
