"""The runner's generation engine: one completion at a time on one model, in-process.

A completion fits the prompt into the context, resumes from the longest prefix the
cache policy (plugd.runner_api) can restore, prefills the rest in chunks, then
decodes pipelined: step n+1 is dispatched to MLX before token n is read, so
the device never waits for Python. All of it must run on one thread (MLX
streams are thread-local).

Under a grammar (structured output) the forward pass of step n+1 is still
dispatched before token n is read; only its sampling waits for the mask, which
depends on token n and is computed while the forward pass runs. A grammar
ends generation only where its structure is complete (the end-of-sequence
tokens are masked until then), so stop strings, which could only cut a
structure short, do not apply to a structured completion; running out of
tokens inside the structure ends it with done_reason "length".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import attrs
import mlx.core as mx
import mlx.nn as nn
from PIL import Image

from plugd.constants import PREFILL_CHUNK
from plugd.protocol import Completion, DoneEvent, PrefillEvent, TokenEvent
from plugd.runner.cache_policy import single_slot
from plugd.runner.grammar import TokenMask
from plugd.runner.media import inside_run, media_runs
from plugd.runner.sampling import NEGATIVE_INFINITY, Sampler
from plugd.runner.stops import StopMatcher
from plugd.runner_api import GrammarRefused, RunnerCachePolicy
from plugd.tokenizer import Detokenizer, Tokenizer

# MLX keeps freed buffers for reuse; generation hands them back every this many tokens.
RELEASE_BUFFERS_EVERY = 256
# The output positions a completion's caches are sized for when it starts (with its prompt, within num_ctx and its
# num_predict), so that memory stays flat while it decodes; a longer one grows them, doubling, as it goes.
DECODE_HEADROOM = 4096


Progress = Callable[[PrefillEvent], None]


def prompt_limit(num_ctx: int) -> int:
    """The most prompt tokens a context of `num_ctx` holds: one place is left for a generated token."""
    return max(num_ctx - 1, 1)


def fit_context(tokens: Sequence[int], num_ctx: int, num_keep: int) -> list[int]:
    """Truncate the prompt as Ollama does: the first `num_keep` tokens and the most recent ones, leaving room
    for at least one generated token."""
    return fit_prompt(tokens, tokens, num_ctx, num_keep)[0]


def fit_prompt(tokens: Sequence[int], keys: Sequence[int], num_ctx: int, num_keep: int) -> tuple[list[int], list[int]]:
    """`fit_context` for tokens and their cache keys together; an image is kept whole or dropped whole."""
    limit = prompt_limit(num_ctx)
    if len(tokens) <= limit:
        return list(tokens), list(keys)
    keep = min(max(num_keep, 0), limit - 1)
    tail = len(tokens) - (limit - keep)
    while inside_run(keys, keep):
        keep -= 1
    while inside_run(keys, tail):
        tail += 1
    return [*tokens[:keep], *tokens[tail:]], [*keys[:keep], *keys[tail:]]


@attrs.frozen
class _PendingToken:
    """A dispatched step's results, not yet read."""

    token: mx.array
    logprob: mx.array | None
    top_ids: mx.array | None
    top_logprobs: mx.array | None

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.token, self.logprob, self.top_ids, self.top_logprobs) if a is not None]

    def read(self) -> TokenEvent:
        event = TokenEvent("", self.token.item())
        if self.logprob is not None:
            event.logprob = self.logprob.item()
        if self.top_ids is not None:  # tokens a grammar ruled out have no probability, so no place among them
            event.top_logprobs = [(t, lp) for t, lp in zip(self.top_ids.tolist(), self.top_logprobs.tolist())
                                  if lp != NEGATIVE_INFINITY]
        return event


@attrs.define
class _Tally:
    prompt_tokens: int
    started_ns: int = attrs.Factory(time.perf_counter_ns)
    first_token_ns: int | None = None
    prompt_eval_count: int = 0
    eval_count: int = 0
    fills_context: bool = False  # the generation's budget is the room num_ctx leaves, not a smaller num_predict

    def done(self, reason: str, text: str = "", stop_sequence: str | None = None) -> DoneEvent:
        now = time.perf_counter_ns()
        prompt_end = self.first_token_ns or now
        return DoneEvent(
            done_reason=reason,
            prompt_tokens=self.prompt_tokens,
            prompt_eval_count=self.prompt_eval_count,
            prompt_eval_duration=prompt_end - self.started_ns,
            eval_count=self.eval_count,
            eval_duration=now - prompt_end,
            text=text,
            stop_sequence=stop_sequence,
            context_full=reason == "length" and self.fills_context,
        )


class Engine:
    """Generates completions on one model, one at a time, reusing the previous completion's caches."""

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, prefill_chunk: int = PREFILL_CHUNK,
                 cache_policy: Callable[[nn.Module], RunnerCachePolicy] = single_slot):
        self.model = model
        self.tokenizer = tokenizer
        self.prefill_chunk = prefill_chunk
        self.cache = cache_policy(model)
        # Only the output's shape is read: MLX builds the graph without computing it.
        self.logits_width: int = model(mx.zeros((1, 1), mx.int32), cache=model.make_cache()).shape[-1]

    def complete(
        self, request: Completion, cancelled: Callable[[], bool], grammar: Callable[[], TokenMask] | None = None,
        images: Mapping[int, Image.Image] | None = None, progress: Progress = lambda event: None,
        keys: Sequence[int] | None = None,
    ) -> Iterator[TokenEvent | DoneEvent]:
        """Token events, then one DoneEvent. `cancelled` is polled between prefill chunks and decode steps;
        `progress` is told where the prefill is as it starts and after each chunk.

        `grammar`, for structured output, gives the request's TokenMask; it is called once the prefill is
        done, so that compiling the grammar can overlap the prefill. `keys` are the cache keys of the prompt's
        tokens where they differ from them (each image's span holds its image's key: plugd.runner.media), and
        `images` the images by key. The request's media and grammar spec are the server's business.
        """
        prompt, keys = fit_prompt(request.tokens, keys or request.tokens, request.num_ctx, request.num_keep)
        if not prompt:
            raise ValueError("a completion needs at least one prompt token")
        if keys[-1] < 0:
            raise ValueError("a prompt must not end with an image")
        try:
            yield from self._complete(_Prompt(prompt, keys, images or {}), request, cancelled, grammar, progress)
        except GrammarRefused:
            raise  # refused between prefill and decode: the caches are whole
        except Exception:
            self.cache.reset()  # a step that failed half-way leaves caches and tokens out of step
            raise
        finally:
            self.cache.finished()

    def _complete(
        self, prompt: _Prompt, request: Completion, cancelled: Callable[[], bool],
        grammar: Callable[[], TokenMask] | None, progress: Progress,
    ):
        tally = _Tally(len(prompt.tokens))
        room = request.num_ctx - len(prompt.tokens)
        budget = room if request.num_predict < 0 else min(request.num_predict, room)
        self.cache.reserve(request.num_ctx, len(prompt.tokens) + min(max(budget, 0), DECODE_HEADROOM))
        if not self._prefill(prompt, tally, cancelled, progress):
            yield tally.done("cancel")
            return
        tally.fills_context = budget == room
        if budget <= 0:
            yield tally.done("length")
            return
        mask = grammar() if grammar is not None else None
        yield from self._decode(prompt.tokens, request, budget, tally, cancelled, mask)

    def _prefill(self, prompt: _Prompt, tally: _Tally, cancelled: Callable[[], bool], progress: Progress) -> bool:
        """Bring the caches up to all but the last prompt token, chunk by chunk; False when cancelled.

        Chunks also end where the cache policy wants to capture a restore point. Neither ever falls inside
        an image's run: the image is evaluated whole in one forward (its positions attend to each other).
        """
        keys, runs = prompt.keys, media_runs(prompt.keys)
        start, end = self.cache.resume(keys), len(keys) - 1
        if inside_run(keys, start):  # no policy restores into an image, since none was ever cut; but be safe
            self.cache.reset()
            start = 0
        embeddings = self._embeddings(prompt, [run for run in runs if run[0] >= start])
        captures = sorted({_before_run(p, runs) for p in self.cache.capture_points(start, end)})
        cached = start
        progress(PrefillEvent(len(keys), cached, 0))
        while start < end:
            if cancelled():
                return False
            stop = min([start + self.prefill_chunk, end, *(p for p in captures if p > start)])
            stop = _chunk_end(start, stop, runs)
            media = [(s - start, embeddings[keys[s]]) for s, _ in runs if start <= s < stop]
            self._prefill_chunk(prompt.tokens[start:stop], keys[start:stop], media)
            tally.prompt_eval_count += stop - start
            self.cache.prefilled()
            start = stop
            progress(PrefillEvent(len(keys), cached, tally.prompt_eval_count))
        return True

    def _embeddings(self, prompt: _Prompt, runs: list[tuple[int, int]]) -> dict[int, mx.array]:
        """The embeddings of the images in `runs`, by key, each image preprocessed and embedded once, evaluated now."""
        wanted = list(dict.fromkeys(prompt.keys[start] for start, _ in runs))
        if not wanted:
            return {}
        pixels = [self.model.preprocess(prompt.images[key]) for key in wanted]
        if len({p.shape for p in pixels}) == 1:
            embedded = list(self.model.embed_media(mx.stack(pixels)))
        else:
            embedded = [self.model.embed_media(p[None])[0] for p in pixels]
        mx.eval(embedded)
        by_key = dict(zip(wanted, embedded, strict=True))
        for start, end in runs:
            if by_key[prompt.keys[start]].shape[0] != end - start:
                raise ValueError(f"an image gives {by_key[prompt.keys[start]].shape[0]} embeddings, "
                                 f"but its placeholder expanded to {end - start} tokens")
        return by_key

    def _prefill_chunk(self, tokens: list[int], keys: list[int], media: list[tuple[int, mx.array]]) -> None:
        """Run `tokens` (whose images' spans `media` holds) through the model into the caches, evaluated now."""
        inputs = mx.array(tokens, mx.int32)[None]
        if media:
            self.model(inputs, cache=self.cache.layers, media=media)
        else:
            self.model(inputs, cache=self.cache.layers)
        mx.eval([layer.state for layer in self.cache.layers])
        self.cache.tokens += keys

    def _decode(
        self, prompt: list[int], request: Completion, budget: int, tally: _Tally, cancelled: Callable[[], bool],
        mask: TokenMask | None,
    ) -> Iterator[TokenEvent | DoneEvent]:
        """Generate up to `budget` tokens from the last prompt token, each step dispatched before the last is read."""
        sampler = Sampler(request.sampling, prompt, request.num_ctx)
        top_n = request.top_logprobs if request.logprobs else 0

        def sample(logits: mx.array) -> _PendingToken:
            return self._sample(logits, sampler, mask.allowed() if mask else None, request.logprobs, top_n)

        pending = sample(self._forward(mx.array(prompt[-1:], mx.int32)))
        self.cache.tokens.append(prompt[-1])
        tally.prompt_eval_count += 1
        detokenizer, stops = Detokenizer(self.tokenizer), StopMatcher(request.stop if mask is None else ())
        while True:
            if cancelled():
                yield tally.done("cancel")
                return
            more = tally.eval_count + 1 < budget
            logits = following = None
            if more:
                logits = self._forward(pending.token)
                if mask is None:
                    following = sample(logits)
                else:
                    mx.async_eval(logits)  # runs while the grammar works out what token n allows next
            event = pending.read()
            if tally.first_token_ns is None:
                tally.first_token_ns = time.perf_counter_ns()
            if more:
                self.cache.tokens.append(event.token)  # `following` fed it to the model
            tally.eval_count += 1
            if tally.eval_count // RELEASE_BUFFERS_EVERY > (tally.eval_count - 1) // RELEASE_BUFFERS_EVERY:
                mx.clear_cache()
            if event.token in self.tokenizer.eos_ids:
                yield tally.done("stop", _remaining_text(detokenizer, stops), stops.matched)
                return
            text = detokenizer.add(event.token)
            if mask is not None:
                mask.accept(event.token, text)
                if more:
                    following = sample(logits)
            event.text = stops.feed(text)
            yield event
            if stops.stopped:
                yield tally.done("stop", stop_sequence=stops.matched)
                return
            if not more:
                text = _remaining_text(detokenizer, stops)
                yield tally.done("stop" if stops.stopped else "length", text, stops.matched)
                return
            pending = following

    def _forward(self, tokens: mx.array) -> mx.array:
        """The next-token logits after feeding `tokens` (1-D, possibly not yet computed) to the model; lazy."""
        return self.model(tokens.reshape(1, -1), cache=self.cache.layers)[0, -1]

    def _sample(
        self, logits: mx.array, sampler: Sampler, allowed: mx.array | None, logprobs: bool, top_n: int
    ) -> _PendingToken:
        """Start computing the token drawn from `logits` (and its log-probabilities)."""
        token, distribution = sampler(logits, allowed)
        chosen = distribution[token] if logprobs else None
        top_ids = top_logprobs = None
        top_n = min(top_n, distribution.shape[-1])
        if top_n > 0:
            candidates = mx.argpartition(-distribution, kth=top_n - 1)[:top_n]
            top_ids = candidates[mx.argsort(-distribution[candidates])]
            top_logprobs = distribution[top_ids]
        pending = _PendingToken(token, chosen, top_ids, top_logprobs)
        mx.async_eval(*pending.arrays())
        return pending


@attrs.frozen
class _Prompt:
    tokens: list[int]
    keys: list[int]
    images: Mapping[int, Image.Image]


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


def _remaining_text(detokenizer: Detokenizer, stops: StopMatcher) -> str:
    """The text still held by the detokenizer and the stop matcher, at the end of generation."""
    text = stops.feed(detokenizer.flush())
    return text if stops.stopped else text + stops.flush()
