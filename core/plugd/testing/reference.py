"""An architecture against a reference implementation: the same logits, the same greedy tokens.

A reference is any callable from (1, length) int32 token ids to
(1, length, vocab) logits that recomputes the whole sequence, so it can wrap
mlx-lm, transformers or a few lines of NumPy. `mlx_lm_reference` loads one
with mlx-lm, optionally with another model type's code: a Llama-style plugin
checks its own model type against mlx-lm's "llama".

Imports MLX, so only tests that run models import it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from attrs import define

from plugd.testing.parity import chunked_prefill, greedy_tokens

Reference = Callable[[mx.array], mx.array]
# Prefill chunk boundaries as fractions of the prompt: uneven, so the cache grows across chunk edges.
CHUNKS = (0.3, 0.65, 0.98, 1.0)


@define
class ParityReport:
    """What `assert_parity` measured: largest last-position logit differences and both greedy continuations."""

    logits_difference: float
    chunked_difference: float
    ours: list[int]
    reference: list[int]


def mlx_lm_reference(checkpoint: Path, model_type: str | None = None) -> Reference:
    """mlx-lm's model for `checkpoint`; with `model_type`, built by that mlx-lm model type's code instead."""
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(checkpoint), model_config={"model_type": model_type} if model_type else None)
    return model


def reference_greedy_tokens(reference: Reference, prompt: mx.array, count: int) -> list[int]:
    """`count` argmax tokens after `prompt`, recomputing the whole sequence at every step."""
    tokens = prompt
    out: list[int] = []
    for _ in range(count):
        token = mx.argmax(reference(tokens[None])[0, -1]).item()
        out.append(token)
        tokens = mx.concatenate([tokens, mx.array([token], mx.int32)])
    return out


def random_prompt(model: nn.Module, length: int = 48, seed: int = 0) -> mx.array:
    """Deterministic int32 token ids drawn from the model's whole vocabulary."""
    vocab = model(mx.zeros((1, 1), mx.int32)).shape[-1]
    return mx.array(np.random.default_rng(seed).integers(0, vocab, length), mx.int32)


def _last_difference(ours: mx.array, reference: mx.array) -> float:
    return mx.abs(ours[0, -1].astype(mx.float32) - reference[0, -1].astype(mx.float32)).max().item()


def assert_parity(
    model: nn.Module,
    reference: Reference,
    prompt: mx.array | None = None,
    *,
    decode_tokens: int = 16,
    tolerance: float = 1e-4,
) -> ParityReport:
    """`model` (an architecture plugin's Model, loaded) agrees with `reference` three ways.

    The last position's logits of the whole prompt, and of the prompt
    prefilled in uneven chunks through the model's own cache, are within
    `tolerance` of the reference's; greedy decoding through the cache yields
    the reference's tokens.
    """
    prompt = random_prompt(model) if prompt is None else prompt
    expected = reference(prompt[None])
    report = ParityReport(_last_difference(model(prompt[None]), expected), 0.0, [], [])
    edges = sorted({0, *(max(1, round(fraction * len(prompt))) for fraction in CHUNKS)})
    report.chunked_difference = _last_difference(chunked_prefill(model, prompt, list(zip(edges, edges[1:]))), expected)
    report.ours = greedy_tokens(model, prompt, decode_tokens)
    report.reference = reference_greedy_tokens(reference, prompt, decode_tokens)
    assert report.logits_difference <= tolerance, f"logits differ by {report.logits_difference:.3g} > {tolerance}"
    assert report.chunked_difference <= tolerance, (
        f"logits after a chunked prefill through the cache differ by {report.chunked_difference:.3g} > {tolerance}"
    )
    assert report.ours == report.reference, f"greedy tokens differ: ours {report.ours}, reference {report.reference}"
    return report
