"""Parity with a reference implementation (mlx-lm): greedy tokens from a model and from mlx-lm, to compare; the
last-position logit difference, a chunked prefill through the model's cache, and a count of evaluations.

Imports MLX and mlx-lm, so only tests that run models import it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import mlx.core as mx
import mlx.nn as nn

T = TypeVar("T")


def last_logits_difference(ours: mx.array, reference: mx.array) -> float:
    """The largest difference between two (1, length, vocab) logits at the last position, computed in float32."""
    return mx.abs(ours[0, -1].astype(mx.float32) - reference[0, -1].astype(mx.float32)).max().item()


def chunked_prefill(model: nn.Module, prompt: mx.array, chunks: Sequence[tuple[int, int]], cache: list | None = None
                    ) -> mx.array:
    """Prefill `prompt` (int32 ids) through `cache` (a fresh one of the model's when None) in `chunks`, (start, end)
    spans that cover it in order; asserts that every layer's cache then holds len(prompt) positions, and returns
    the last chunk's logits."""
    cache = model.make_cache() if cache is None else cache
    for start, end in chunks:
        logits = model(prompt[None, start:end], cache)
    assert [layer.offset for layer in cache] == [len(prompt)] * len(cache)
    return logits


def counted_evaluations(action: Callable[[], T]) -> tuple[T, list[int]]:
    """What `action` returns, and for each `mx.eval` call while it ran how many arguments it was given: a load that
    reads, folds and casts every tensor in one evaluation gives [1]."""
    counts: list[int] = []
    real_eval = mx.eval

    def counting_eval(*arrays):
        counts.append(len(arrays))
        real_eval(*arrays)

    mx.eval = counting_eval
    try:
        return action(), counts
    finally:
        mx.eval = real_eval


def greedy_tokens(model: nn.Module, prompt: mx.array, count: int) -> list[int]:
    """Prefill `prompt` (int32 ids), then decode `count` argmax tokens one at a time through the model's own cache."""
    cache = model.make_cache()
    logits = model(prompt[None], cache)
    tokens = []
    for _ in range(count):
        token = mx.argmax(logits[:, -1], axis=-1)
        tokens.append(token.item())
        logits = model(token[None], cache)
    return tokens


def mlx_lm_greedy_tokens(checkpoint: Path, prompt: mx.array, count: int) -> list[int]:
    """The same from mlx-lm loading the checkpoint directory; fails if it stops early at an end-of-sequence token."""
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = mlx_lm.load(str(checkpoint))
    steps = list(mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=count, sampler=make_sampler(temp=0.0)))
    assert steps[-1].finish_reason == "length", "mlx-lm stopped early: the comparison would cover fewer tokens"
    return [step.token for step in steps]
