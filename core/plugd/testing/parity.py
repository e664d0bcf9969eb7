"""Parity with a reference implementation (mlx-lm): greedy tokens from a model and from mlx-lm, to compare.

Imports MLX and mlx-lm, so only tests that run models import it.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn


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
