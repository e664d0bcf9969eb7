"""Bringing one sequence's prompt into the cache policy's live caches, a chunk at a time.

The prefill resumes from the longest prefix the policy (plugd.runner_api) can restore and evaluates the rest,
all but the last token (which the sequence's first decode step feeds), in chunks of at most `chunk` positions.
Chunks also end where the policy wants to capture a restore point. Neither ever falls inside an image's run:
the image is evaluated whole in one forward (its positions attend to each other).
"""

from __future__ import annotations

from collections.abc import Iterator

import mlx.core as mx
import mlx.nn as nn

from plugd.constants import DECODE_HEADROOM
from plugd.nn.media import media_length
from plugd.protocol import PrefillEvent
from plugd.runner.media import inside_run, media_runs
from plugd.runner.sequence import Prompt, Sequence
from plugd.runner_api import RunnerCachePolicy


def prefill(model: nn.Module, policy: RunnerCachePolicy, sequence: Sequence, chunk: int,
            decode_in_place: bool = False) -> Iterator[None]:
    """Evaluate the sequence's prompt into `policy`'s caches, yielding before each chunk (where the engine may
    run other work, or stop when the sequence is cancelled). With `decode_in_place` the sequence goes on to
    decode in these caches, so they are sized for a share of its output too."""
    prompt, tally = sequence.prompt, sequence.tally
    keys, runs = prompt.keys, media_runs(prompt.keys)
    output = min(max(sequence.budget, 0), DECODE_HEADROOM) if decode_in_place else 0
    policy.reserve(sequence.request.num_ctx, len(keys) + output)
    start, end = policy.resume(keys), len(keys) - 1
    if inside_run(keys, start):  # no policy restores into an image, since none was ever cut; but be safe
        policy.reset()
        start = 0
    embeddings = _embeddings(model, prompt, [run for run in runs if run[0] >= start])
    captures = sorted({_before_run(p, runs) for p in policy.capture_points(start, end)})
    cached = start
    sequence.progress(PrefillEvent(len(keys), cached, 0))
    while start < end:
        yield
        stop = min([start + chunk, end, *(p for p in captures if p > start)])
        stop = _chunk_end(start, stop, runs)
        media = [(s - start, embeddings[keys[s]]) for s, _ in runs if start <= s < stop]
        _prefill_chunk(model, policy, prompt.tokens[start:stop], keys[start:stop], media)
        tally.prompt_eval_count += stop - start
        policy.prefilled()
        start = stop
        sequence.progress(PrefillEvent(len(keys), cached, tally.prompt_eval_count))


def _embeddings(model: nn.Module, prompt: Prompt, runs: list[tuple[int, int]]) -> dict[int, mx.array]:
    """The embeddings of the images in `runs`, by key, each image preprocessed and embedded once, evaluated now."""
    wanted = list(dict.fromkeys(prompt.keys[start] for start, _ in runs))
    if not wanted:
        return {}
    pixels = [model.preprocess(prompt.images[key]) for key in wanted]
    if len({p.shape for p in pixels}) == 1:
        embedded = list(model.embed_media(mx.stack(pixels)))
    else:
        embedded = [model.embed_media(p[None])[0] for p in pixels]
    mx.eval(embedded)
    by_key = dict(zip(wanted, embedded, strict=True))
    for start, end in runs:
        if (length := media_length(by_key[prompt.keys[start]])) != end - start:
            raise ValueError(f"an image gives {length} embeddings, but its placeholder expanded to {end - start} tokens")
    return by_key


def _prefill_chunk(model: nn.Module, policy: RunnerCachePolicy, tokens: list[int], keys: list[int],
                   media: list[tuple[int, mx.array]]) -> None:
    """Run `tokens` (whose images' spans `media` holds) through the model into the caches, evaluated now."""
    inputs = mx.array(tokens, mx.int32)[None]
    if media:
        model(inputs, cache=policy.layers, media=media)
    else:
        model(inputs, cache=policy.layers)
    mx.eval([layer.state for layer in policy.layers])
    policy.tokens += keys


def _before_run(position: int, runs: list[tuple[int, int]]) -> int:
    """`position`, or the start of the image run it falls inside."""
    return next((start for start, end in runs if start < position < end), position)


def _chunk_end(start: int, stop: int, runs: list[tuple[int, int]]) -> int:
    """`stop`, moved off any image run it would cut: back to the run's start, or, for a run the chunk begins
    with, on to its end."""
    for run_start, run_end in runs:
        if run_start < stop < run_end:
            return run_start if run_start > start else run_end
    return stop
