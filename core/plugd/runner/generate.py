"""The runner's generation engine: completions on one model, in-process, decoded together in one batch.

A completion (a `Sequence`) fits its prompt into the context and waits its
turn to prefill: one sequence at a time brings its prompt into the cache
policy's live caches (plugd.runner.prefill), resuming from the longest prefix
the policy (plugd.runner_api) can restore, so that concurrent prompts sharing
a prefix evaluate it once. Its caches are then copied into a row of the batch
(plugd.runner.batch), and the policy is free for the next prompt. Each `step`
evaluates one prefill chunk and one decode step of every row, so a long
prompt holds the decoding rows up by at most one chunk. A row that ends
leaves at once, and its caches go back to the policy (`adopt`), so that the
next turn of its conversation resumes after its output.

A batch that has not begun decoding waits for the prompts queued with it
(for at most `burst_chunks` prefill chunks' positions): a burst of requests then decodes
together from its first step, rather than in partial batches squeezed between
the prefills, each of which costs a whole pass over the weights for a few
tokens. Rows that are decoding never wait for a prefill beyond one chunk.

Decoding is pipelined: step n+1 is dispatched to MLX before token n is read,
so the device never waits for Python. All of it must run on one thread (MLX
streams are thread-local).

Under a grammar (structured output) the forward pass of step n+1 is still
dispatched before token n is read; only the row's sampling waits for its mask,
which depends on token n and is computed while the forward pass runs. A
grammar ends generation only where its structure is complete (the
end-of-sequence tokens are masked until then), so stop strings, which could
only cut a structure short, do not apply to a structured completion; running
out of tokens inside the structure ends it with done_reason "length".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Sequence as Ordered
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from PIL import Image

from plugd.constants import PREFILL_CHUNK
from plugd.protocol import Completion, DoneEvent, PrefillEvent, TokenEvent
from plugd.runner.batch import Batch
from plugd.runner.cache_policy import single_slot
from plugd.runner.drafting import Drafted, Drafter, weight_bytes
from plugd.runner.grammar import TokenMask
from plugd.runner.media import inside_run
from plugd.runner.prefill import prefill
from plugd.runner.sequence import Emit, Prompt, Sequence
from plugd.runner.speculative import Speculator
from plugd.runner_api import GrammarRefused, RunnerCachePolicy
from plugd.tokenizer import Tokenizer

# MLX keeps freed buffers for reuse; decoding hands them back every this many steps (a speculative round counting
# as the positions it fed).
RELEASE_BUFFERS_EVERY = 256

Progress = Callable[[PrefillEvent], None]


def prompt_limit(num_ctx: int) -> int:
    """The most prompt tokens a context of `num_ctx` holds: one place is left for a generated token."""
    return max(num_ctx - 1, 1)


def fit_context(tokens: Ordered[int], num_ctx: int, num_keep: int) -> list[int]:
    """Truncate the prompt as Ollama does: the first `num_keep` tokens and the most recent ones, leaving room
    for at least one generated token."""
    return fit_prompt(tokens, tokens, num_ctx, num_keep)[0]


def fit_prompt(tokens: Ordered[int], keys: Ordered[int], num_ctx: int, num_keep: int) -> tuple[list[int], list[int]]:
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


class Engine:
    """Generates completions on one model, several at once, reusing earlier completions' caches."""

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, prefill_chunk: int = PREFILL_CHUNK,
                 cache_policy: Callable[[nn.Module], RunnerCachePolicy] = single_slot, one_at_a_time: bool = False,
                 agree: Callable[[mx.array], mx.array] = lambda token: token, burst_chunks: int = 0,
                 drafter: Drafter | None = None):
        """`one_at_a_time`: a completion is submitted only once the one before has ended (the daemon sends one
        at a time), so the one decoding needs no caches of its own: it decodes in the policy's. `agree` turns
        each token drawn into the one every rank of a group decodes (plugd.runner.group). `burst_chunks`: the
        most prompt positions, in prefill chunks, that a batch that has not begun decoding waits through for the
        prompts queued with it. With a `drafter`, a row that decodes alone decodes speculatively
        (plugd.runner.speculative); its caches ride with the model's."""
        self.model = model if drafter is None else Drafted(model, drafter)
        self.tokenizer = tokenizer
        self.prefill_chunk = prefill_chunk
        self.cache = cache_policy(self.model)
        self.agree = agree
        # Only the output's shape is read: MLX builds the graph without computing it.
        self.logits_width: int = model(mx.zeros((1, 1), mx.int32), cache=model.make_cache()).shape[-1]
        self.batch = Batch(self.model, alone=one_at_a_time, step=None if drafter is None else self.model.decode)
        self.speculator = None if drafter is None else Speculator(
            self.model, self.logits_width, cost=drafter.weight_bytes / weight_bytes(model))
        self._waiting: deque[Sequence] = deque()
        self._prefilling: tuple[Sequence, Iterator[None]] | None = None
        self._returned: tuple[list[Any], list[int]] | None = None  # a finished row's caches, for the policy
        self._steps = 0
        self.burst_chunks = burst_chunks
        self._waited = 0  # the prompt positions the batch has waited through before its first decode step
        self._joined = False  # a row joined the batch in the step under way

    @property
    def idle(self) -> bool:
        return not (self._waiting or self._prefilling or self.batch.rows)

    def submit(
        self, request: Completion, emit: Emit, cancelled: Callable[[], bool],
        grammar: Callable[[], TokenMask] | None = None, images: Mapping[int, Image.Image] | None = None,
        progress: Progress = lambda event: None, keys: Ordered[int] | None = None,
    ) -> Sequence:
        """Queue a completion; `step` runs it. `emit` gets its token events, then one DoneEvent (or the exception
        that ended it), then None. `cancelled` is polled before each of its prefill chunks and decode steps;
        `progress` is told where its prefill is as it starts and after each chunk.

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
        sequence = Sequence(request, Prompt(prompt, keys, images or {}), emit, cancelled, grammar, progress)
        self._waiting.append(sequence)
        return sequence

    def complete(
        self, request: Completion, cancelled: Callable[[], bool], grammar: Callable[[], TokenMask] | None = None,
        images: Mapping[int, Image.Image] | None = None, progress: Progress = lambda event: None,
        keys: Ordered[int] | None = None,
    ) -> Iterator[TokenEvent | DoneEvent]:
        """One completion run to its end (`submit`'s arguments), with whatever else is queued: its events, the
        exception that ended it raised."""
        events: deque = deque()
        self.submit(request, events.append, cancelled, grammar, images, progress, keys)
        while True:
            while events:
                event = events.popleft()
                if event is None:
                    return
                if isinstance(event, Exception):
                    raise event
                yield event
            self.step()

    def step(self) -> None:
        """One prefill chunk of the sequence whose turn it is, then one decode step of every decoding row (unless
        the batch waits for its burst: `_waits_for_burst`)."""
        if not self.batch.rows:
            self._waited = 0
        self._joined = False
        if self._prefilling is None and not (self.batch.alone and self.batch.rows):
            self._start_prefill()
        evaluated = self._prefill_step()
        if self._waits_for_burst():
            self._waited += evaluated
            self._end_cancelled(self.batch.rows)
            self._leave([s for s in self.batch.rows if s.ended])
        elif self.batch.rows:
            self._decode_step()

    def _waits_for_burst(self) -> bool:
        """Whether the batch's first decode step waits: none of its rows has decoded yet, the batch has waited
        through fewer than `burst_chunks` chunks' positions, and another prompt is being prefilled or queued, or a
        row joined in this very step (the next step's turn brings the requests that arrived while it prefilled)."""
        rows = self.batch.rows
        pending = self._prefilling is not None or bool(self._waiting) or self._joined
        room = self._waited < self.burst_chunks * self.prefill_chunk
        return bool(rows) and pending and room and not any(s.decoding for s in rows)

    def live_bytes(self) -> int:
        """What the live caches hold: the policy's and the decoding rows'."""
        return sum(layer.nbytes for layer in self.cache.layers) + self.batch.nbytes

    def _start_prefill(self) -> None:
        """The next waiting sequence resumes from the policy's caches, up to its first chunk; the ones waiting
        behind it that were cancelled end."""
        if not self._waiting:
            return
        sequence = self._waiting.popleft()
        for waiting in [s for s in self._waiting if s.cancelled()]:
            self._waiting.remove(waiting)
            waiting.end(waiting.tally.done("cancel"))
        chunks = prefill(self.model, self.cache, sequence, self.prefill_chunk, decode_in_place=self.batch.alone)
        self._prefilling = (sequence, chunks)
        self._advance(*self._prefilling)

    def _prefill_step(self) -> int:
        """The next chunk of the prefill under way, if any; the prompt positions it evaluated."""
        if self._prefilling is None:
            return 0
        sequence, chunks = self._prefilling
        before = sequence.tally.prompt_eval_count
        if sequence.cancelled():
            self._settle(sequence, sequence.tally.done("cancel"))
        else:
            self._advance(sequence, chunks)
        return sequence.tally.prompt_eval_count - before

    def _advance(self, sequence: Sequence, chunks: Iterator[None]) -> None:
        """Run the prefill to its next chunk; hand the sequence off to the batch when the prefill is done."""
        try:
            if next(chunks, StopIteration) is StopIteration:
                self._hand_off(sequence)
        except Exception as exc:
            self.cache.reset()  # a step that failed half-way leaves caches and tokens out of step
            self._settle(sequence, exc)

    def _hand_off(self, sequence: Sequence) -> None:
        """The prompt is in the policy's caches: the sequence joins the batch with a copy of them."""
        try:
            mask = sequence.grammar() if sequence.grammar is not None else None
        except GrammarRefused as exc:  # refused between prefill and decode: the caches are whole
            self._settle(sequence, exc)
            return
        if sequence.budget <= 0:
            self._settle(sequence, sequence.tally.done("length"))
            return
        sequence.start_decoding(self.tokenizer, mask, self.agree)
        self.batch.join(sequence, self.cache.layers)
        self._joined = True
        self._settle(sequence, None)

    def _settle(self, sequence: Sequence, outcome: DoneEvent | Exception | None) -> None:
        """The policy's caches are done with `sequence`'s prefill (which ended it with `outcome`, if any)."""
        self._prefilling = None
        self.cache.finished()
        if outcome is not None:
            sequence.end(outcome)
        if self._returned is not None:
            self.cache.adopt(*self._returned)
            self._returned = None

    def _decode_step(self) -> None:
        rows = list(self.batch.rows)
        steps = self._steps
        self._steps += 1
        try:
            depth = self._draft_depth(rows)
            if depth:
                self._steps += self._speculate(rows[0], depth) - 1
            else:
                self._decode(rows)
        except Exception as exc:  # a forward pass failed: every row fails, and the batch's caches go
            for sequence in rows:
                sequence.end(exc)
            if self.batch.alone:  # they were the policy's
                self.cache.reset()
            self.batch.clear()
        if self._steps // RELEASE_BUFFERS_EVERY != steps // RELEASE_BUFFERS_EVERY:
            mx.clear_cache()

    def _draft_depth(self, rows: list[Sequence]) -> int:
        """How many tokens to draft for the lone row, when it decodes alone and speculation pays; else 0."""
        if self.speculator is None or len(rows) != 1:
            return 0
        (sequence,) = rows
        if sequence.cancelled() or not sequence.more:
            return 0
        return self.speculator.depth(sequence)

    def _speculate(self, sequence: Sequence, depth: int) -> int:
        """One speculative round of the lone row (plugd.runner.speculative); the positions it fed."""
        fed = self.speculator.round(sequence, self.batch.solo(), depth, self.tokenizer.eos_ids)
        if sequence.ended:
            self._leave([sequence])
        return fed

    @staticmethod
    def _end_cancelled(rows: list[Sequence]) -> None:
        for sequence in rows:
            if sequence.cancelled():
                sequence.end(sequence.tally.done("cancel"))

    def _decode(self, rows: list[Sequence]) -> None:
        """Feed every row its token, draw each row's next one, and read the ones drawn the step before."""
        self._end_cancelled(rows)
        last = [s for s in rows if not s.ended and not s.more]  # read without feeding: their budget ends there
        self._leave([s for s in rows if s.ended or not s.more])
        feeding = list(self.batch.rows)
        drawn: dict[Sequence, Any] = {}
        logits = None
        if feeding:
            had_token = [s.pending is not None for s in feeding]
            logits = self.batch.forward(mx.concatenate([s.feed() for s in feeding]))
            for i, sequence in enumerate(feeding):
                if not sequence.structured:
                    drawn[sequence] = sequence.draw(logits[i])
            if len(drawn) < len(feeding):
                mx.async_eval(logits)  # runs while the grammars work out what their rows allow next
        for sequence in last:
            self._read(sequence, fed=False)
        for i, sequence in enumerate(feeding):
            if had_token[i] and self._read(sequence, fed=True):
                continue
            if sequence.structured and not sequence.ended:
                drawn[sequence] = self._guarded(sequence, lambda s=sequence, i=i: s.draw(logits[i]))
        for sequence in feeding:
            sequence.pending = drawn.get(sequence)
        self._leave([s for s in feeding if s.ended])

    def _read(self, sequence: Sequence, fed: bool) -> bool:
        """Read a row's pending token; True when the sequence has ended (then or through a failure)."""
        return self._guarded(sequence, lambda: sequence.read(fed, self.tokenizer.eos_ids)) in (True, None)

    @staticmethod
    def _guarded(sequence: Sequence, work: Callable[[], Any]) -> Any:
        """`work` for one row: a failure (its grammar's, say) ends that row alone, and gives None."""
        try:
            return work()
        except Exception as exc:
            sequence.end(exc)
            return None

    def _leave(self, leaving: list[Sequence]) -> None:
        """Take rows out of the batch; the last one's caches go back to the policy, once no prefill uses it."""
        for sequence, caches in self.batch.leave(leaving):
            if self.speculator is not None:
                self.speculator.forget(sequence)
            if isinstance(sequence.outcome, Exception):
                continue
            if self.speculator is not None:  # a lazy drafter catches up before the policy takes the caches
                self.model.level(caches, sequence.fed_tokens()[: caches[0].offset])
            self._returned = (caches, sequence.held)
        if self._returned is not None and self._prefilling is None:
            self.cache.adopt(*self._returned)
            self._returned = None
