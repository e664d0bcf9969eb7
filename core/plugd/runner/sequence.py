"""One completion inside the engine: its prompt, its own sampler, grammar and stop strings, its counts and timings,
and where its events go.

A sequence decodes as one row of the engine's batch. Each step it feeds the
model one token (`feed`: the prompt's last one at first, then the token it
drew last, still being computed), and from the step's logits draws its next
one (`draw`), before the previous one has been read (`read`): so a row's
token n is known only after step n+1 has been dispatched.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import attrs
import mlx.core as mx
from PIL import Image

from plugd.protocol import Completion, DoneEvent, PrefillEvent, RunnerEvent, TokenEvent
from plugd.runner.grammar import TokenMask
from plugd.runner.sampling import NEGATIVE_INFINITY, Sampler
from plugd.runner.stops import StopMatcher
from plugd.runner.verification import verify
from plugd.tokenizer import Detokenizer, Tokenizer

# An event, or the exception that ended the sequence; None once it has ended.
Emit = Callable[[RunnerEvent | Exception | None], None]


@attrs.frozen
class Prompt:
    tokens: list[int]
    keys: list[int]  # the cache key of each token (an image's span holds its image's: plugd.runner.media)
    images: Mapping[int, Image.Image]


@attrs.frozen
class PendingToken:
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
class Tally:
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


class Sequence:
    """One completion's state from its admission to its end. `emit` receives its events, then None."""

    def __init__(self, request: Completion, prompt: Prompt, emit: Emit, cancelled: Callable[[], bool],
                 grammar: Callable[[], TokenMask] | None, progress: Callable[[PrefillEvent], None]):
        self.request, self.prompt = request, prompt
        self.cancelled, self.grammar, self.progress = cancelled, grammar, progress
        self._emit = emit
        self.tally = Tally(len(prompt.tokens))
        room = request.num_ctx - len(prompt.tokens)
        self.budget = room if request.num_predict < 0 else min(request.num_predict, room)
        self.tally.fills_context = self.budget == room
        self.held: list[int] = []  # the cache keys its batch row holds, once it decodes
        self.decoding = False  # a decode step has fed it
        self.pending: PendingToken | None = None
        self.outcome: DoneEvent | Exception | None = None  # how it ended
        self._mask: TokenMask | None = None
        self._agree: Callable[[mx.array], mx.array] | None = None
        self._sampler: Sampler | None = None
        self._detokenizer: Detokenizer | None = None
        self._stops: StopMatcher | None = None

    def start_decoding(self, tokenizer: Tokenizer, mask: TokenMask | None,
                       agree: Callable[[mx.array], mx.array]) -> None:
        """Its prompt is in its row's caches but for the last token, which the next step feeds; `agree` gives the
        token to decode for the one drawn (Engine's)."""
        self._mask = mask
        self._agree = agree
        self._sampler = Sampler(self.request.sampling, self.prompt.tokens, self.request.num_ctx)
        self._detokenizer = Detokenizer(tokenizer)
        self._stops = StopMatcher(self.request.stop if mask is None else ())
        self.held = list(self.prompt.keys[:-1])

    @property
    def structured(self) -> bool:
        return self._mask is not None

    @property
    def mask(self) -> TokenMask | None:
        return self._mask

    def fed_tokens(self) -> list[int]:
        """The token ids of the positions its caches hold, and of the one it feeds next (cache keys are not ids
        where images are)."""
        return [*self.prompt.tokens, *self.held[len(self.prompt.keys) :]]

    @property
    def more(self) -> bool:
        """Whether the step after the pending token's may run: the budget has room past it."""
        return self.pending is None or self.tally.eval_count + 1 < self.budget

    def feed(self) -> mx.array:
        """The (1,) token this row feeds the next step: the prompt's last, or the one it drew last."""
        self.decoding = True
        if self.pending is None:
            self.held.append(self.prompt.keys[-1])
            self.tally.prompt_eval_count += 1
            return mx.array(self.prompt.tokens[-1:], mx.int32)
        return self.pending.token.reshape(1)

    def draw(self, logits: mx.array) -> PendingToken:
        """Start computing the token drawn from this row's `logits` (and its log-probabilities)."""
        token, distribution = self._sampler(logits, self._mask.allowed() if self._mask else None)
        return self._pending(self._agree(token), distribution)

    @property
    def sampler(self) -> Sampler:
        return self._sampler

    def verified(self, logits: mx.array, drafted: mx.array, draft_scores: mx.array, allowed: mx.array | None = None,
                 ) -> tuple[mx.array, list[PendingToken], PendingToken]:
        """Verify `drafted` (k,) tokens, drawn from `draft_scores` (k, vocab), against the target's `logits` for the
        k + 1 positions from the one the first drafted token takes (plugd.runner.verification): how many are
        kept (lazy), each drafted token as this row would emit it, and the token after the kept ones. Nothing
        is drawn as far as the sampler knows until `kept` says how many (`advance`). `allowed`: each position's
        grammar mask, (k + 1, vocab)."""
        logprobs, scores = self._sampler.positions(logits, drafted, allowed)
        greedy = self.request.sampling.greedy
        kept, after = verify(scores, drafted, draft_scores, greedy, None if greedy else self._sampler.next_key())
        candidates = [self._pending(drafted[i], logprobs[i]) for i in range(drafted.shape[0])]
        return kept, candidates, self._pending(after, logprobs[kept])

    def _pending(self, token: mx.array, distribution: mx.array) -> PendingToken:
        """The pending token `token` was drawn from log-probabilities `distribution`; its arrays start computing."""
        request = self.request
        chosen = distribution[token] if request.logprobs else None
        top_ids = top_logprobs = None
        top_n = min(request.top_logprobs if request.logprobs else 0, distribution.shape[-1])
        if top_n > 0:
            candidates = mx.argpartition(-distribution, kth=top_n - 1)[:top_n]
            top_ids = candidates[mx.argsort(-distribution[candidates])]
            top_logprobs = distribution[top_ids]
        pending = PendingToken(token, chosen, top_ids, top_logprobs)
        mx.async_eval(*pending.arrays())
        return pending

    def read(self, fed: bool, eos_ids: frozenset[int]) -> bool:
        """Read the pending token and emit it (`fed`: the step just dispatched fed it to the row); True when it
        ended the sequence. A structured sequence's grammar accepts it here, before its next draw."""
        event = self.pending.read()
        tally = self.tally
        if tally.first_token_ns is None:
            tally.first_token_ns = time.perf_counter_ns()
        if fed:
            self.held.append(event.token)
        tally.eval_count += 1
        if event.token in eos_ids:
            self.end(tally.done("stop", self._remaining_text(), self._stops.matched))
            return True
        text = self._detokenizer.add(event.token)
        if self._mask is not None:
            self._mask.accept(event.token, text)
        event.text = self._stops.feed(text)
        self._emit(event)
        if self._stops.stopped:
            self.end(tally.done("stop", stop_sequence=self._stops.matched))
            return True
        if not fed:  # the budget ran out with this token
            text = self._remaining_text()
            self.end(tally.done("stop" if self._stops.stopped else "length", text, self._stops.matched))
            return True
        return False

    @property
    def ended(self) -> bool:
        return self.outcome is not None

    def end(self, outcome: DoneEvent | Exception) -> None:
        """Its last event (or the exception that stopped it), then the end of its events."""
        if self.outcome is None:
            self.outcome = outcome
            self._emit(outcome)
            self._emit(None)

    def _remaining_text(self) -> str:
        """The text still held by the detokenizer and the stop matcher, at the end of generation."""
        text = self._stops.feed(self._detokenizer.flush())
        return text if self._stops.stopped else text + self._stops.flush()
