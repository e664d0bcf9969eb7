"""Speculative decoding: a lone decoding row emits several tokens a step.

Each round the drafter (plugd.runner.drafting) proposes up to `depth` tokens
after the row's pending one, and one forward pass of the target over the
pending token and the drafted ones scores every position; the drafted tokens
the target's own sampling would give are kept (plugd.runner.verification),
and the target's token after them becomes the row's next pending one. The
caches are then brought back to what was kept: trimmed, or, where a layer
cannot trim (a recurrent state), restored to where the round began and fed
the kept tokens again.

A runner drafts for a row only while it decodes alone: with several rows,
one batched forward pass already serves each of them for the cost of about
one, and their drafts would make every step wait for the slowest row's. The
depth adapts to each row's acceptance (`DraftDepth`), down to plain decoding
when drafting would not pay.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from plugd.constants import MAX_DRAFT_TOKENS
from plugd.runner.drafting import Checkpoint, Drafted, DraftSession
from plugd.runner.sequence import Sequence

# What the verifying pass costs beyond a plain decode step, as shares of one: a part for scoring more than one
# position and a part per drafted token. Where a step is bound by reading the weights (a GPU) both are small; on a
# CPU the pass leaves matrix-vector kernels for matrix-matrix ones (bench/decode.py's model: 1.28x a plain step
# for 2 positions, 1.45x for 5, 1.89x for 9).
VERIFY_COST = {"cpu": (0.2, 0.1), "gpu": (0.02, 0.02)}
# While drafting does not pay, a round of depth 1 measures it again after this many tokens, twice as many after
# each probe whose draft was refused (up to PROBE_LONGEST), as many again after one kept.
PROBE_EVERY, PROBE_LONGEST = 32, 256
ACCEPTANCE_PRIOR = 0.6  # what a row's acceptance is taken to be before its first round (but see Speculator.depth)
ACCEPTANCE_WEIGHT = 0.3  # the weight of the latest round in a row's acceptance


class Acceptance:
    """Per place in a round, an exponential average of whether the drafted token there was kept, over the rounds
    that reached it: a drafter that feeds on its own guesses (an MTP head past its first) guesses worse the
    further it goes."""

    def __init__(self, places: list[float]):
        self.places = list(places)

    def record(self, drafted: int, kept: int) -> None:
        """A round drafted `drafted` tokens and the first `kept` of them were kept."""
        for place in range(min(drafted, kept + 1, len(self.places))):  # past the first refused, none was tried
            self.places[place] += ACCEPTANCE_WEIGHT * ((place < kept) - self.places[place])


class DraftDepth:
    """How many tokens to draft for one row: the depth that maximises the expected tokens per unit of work, from
    the acceptance measured on the row's rounds (starting from `prior`) and what a drafted token costs next to a
    plain step."""

    def __init__(self, cost: float, limit: int, verify: tuple[float, float], prior: list[float]):
        self.cost, self.limit, self.verify = cost, limit, verify
        self.acceptance = Acceptance(prior[:limit])
        self._since_probe, self._probe_every = 0, PROBE_EVERY

    def choose(self, room: int) -> int:
        """The depth of the next round, at most `room`; 0 for a plain decode step."""
        best = max(range(self.limit + 1), key=self._gain)
        if best == 0:
            self._since_probe += 1
            if self._since_probe >= self._probe_every:
                best = 1
        return min(best, room)

    def record(self, drafted: int, kept: int) -> None:
        if drafted:
            probing = self._since_probe >= self._probe_every
            if probing:
                self._probe_every = PROBE_EVERY if kept else min(2 * self._probe_every, PROBE_LONGEST)
            self._since_probe = 0
        self.acceptance.record(drafted, kept)

    def _gain(self, depth: int) -> float:
        """Expected tokens per round over its cost, in plain steps: the token after the kept ones, and each
        drafted token where every one before it was kept."""
        tokens, reached = 1.0, 1.0
        for place in range(depth):
            reached *= self.acceptance.places[place]
            tokens += reached
        fixed, per_token = self.verify
        return tokens / (1 + depth * (self.cost + per_token) + (fixed if depth else 0))


class Speculator:
    """Runs speculative rounds for a lone row whose caches are single-sequence ones (plugd.nn.cache)."""

    def __init__(self, model: Drafted, width: int, cost: float):
        """`width`: the target's logits; `cost`: a drafted token's share of a plain step (the drafter's size over
        the target's)."""
        self.model, self.width, self.cost = model, width, cost
        self._depths: dict[Sequence, DraftDepth] = {}
        self._learned = Acceptance([ACCEPTANCE_PRIOR] * MAX_DRAFT_TOKENS)  # over every row's rounds
        self.drafted = self.kept = 0  # tokens drafted and kept, over every round

    def depth(self, sequence: Sequence) -> int:
        """How many tokens to draft for `sequence` this step (0: decode it plainly): its `DraftDepth`, within what
        its budget leaves after the pending token and the one after the drafted ones."""
        room = sequence.budget - sequence.tally.eval_count - (1 if sequence.pending is None else 2)
        mask = sequence.mask
        if room < 1 or mask is not None and not (mask.active and mask.rolls_back):
            return 0
        limit = sequence.request.draft_tokens
        if not limit:
            return 0
        if sequence not in self._depths:
            # A greedy row starts from what this runner's rows have measured so far, since its output does not
            # depend on how deep it drafts; a sampled one from the prior, so that its seed gives its text again.
            prior = self._learned.places if sequence.request.sampling.greedy else [ACCEPTANCE_PRIOR] * limit
            self._depths[sequence] = DraftDepth(self.cost, limit, VERIFY_COST[mx.default_device().type.name], prior)
        return self._depths[sequence].choose(room)

    def stats(self) -> dict[str, Any]:
        """What drafts, and the tokens drafted and kept so far, for a status line."""
        return {"drafter": self.model.drafter.kind, "drafted": self.drafted, "kept": self.kept}

    def forget(self, sequence: Sequence) -> None:
        self._depths.pop(sequence, None)

    def round(self, sequence: Sequence, layers: list[Any], depth: int, eos_ids: frozenset[int]) -> int:
        """One round of at most `depth` drafted tokens: the row's pending token (or its prompt's last) and the
        kept ones fed, read and emitted, the token after them pending. Returns the positions fed.

        A structured row reads its pending token first, since its grammar must accept it before drafting goes
        on; the drafts are accepted as they are drawn, so each is drawn under the mask it would be decoded with,
        and rolled back before the kept ones are read."""
        reading_first = sequence.pending is not None
        first = sequence.feed()
        if sequence.structured and reading_first and sequence.read(True, eos_ids):
            self.model(first[None], cache=layers)
            return 1
        follow = not self.model.drafter.lazy  # a lazy drafter keeps what it was fed while drafting instead
        checked = layers if follow else self.model.own(layers)
        start = Checkpoint(checked)
        session = self.model.drafter.session(self.model.drafts(layers), sequence.fed_tokens()[: start.offsets[0]])
        drafted, draft_scores, allowed = self._draft(sequence, first, session, depth, eos_ids)
        fed = mx.concatenate([first, drafted])
        logits = self.model(fed[None], cache=layers, follow=follow)[0]
        kept, candidates, after = sequence.verified(logits, drafted, draft_scores, allowed)
        mx.async_eval(kept, after.token)
        ended = reading_first and not sequence.structured and sequence.read(True, eos_ids)
        count = 0 if ended else kept.item()
        read = 0
        while not ended and read < count:
            sequence.pending = candidates[read]
            read += 1
            ended = sequence.read(True, eos_ids)
        if not ended:
            sequence.sampler.advance(mx.concatenate([drafted[:count], after.token[None]]))
            sequence.pending = after
        self._depths[sequence].record(drafted.shape[0], count)
        self._learned.record(drafted.shape[0], count)
        self.drafted, self.kept = self.drafted + drafted.shape[0], self.kept + count
        if not start.keep(checked, 1 + read):
            self.model(fed[None, : 1 + read], cache=layers, follow=follow)
        session.end(1 + read)
        return 1 + read

    def _draft(self, sequence: Sequence, first: mx.array, session: DraftSession, depth: int, eos_ids: frozenset[int],
               ) -> tuple[mx.array, mx.array, mx.array | None]:
        """Up to `depth` tokens drawn one after another from the drafter after `first`, the scores each was drawn
        from (the row's sampling applied to the drafter's logits), lazy, and under a grammar each position's mask,
        that of the position after the last drafted one included (fewer tokens where a stop token was drawn)."""
        mask = sequence.mask
        tokens, scores, masks = [], [], []
        token = first
        for _ in range(depth):
            allowed = None if mask is None else mask.allowed()
            logits = self._fit(session.propose(token))
            following = mx.concatenate(tokens) if tokens else mx.zeros((0,), mx.int32)
            position = sequence.sampler.scored(logits, following, allowed)[1]
            token = sequence.sampler.choose(position)[None]
            tokens.append(token)
            scores.append(position)
            masks.append(allowed)
            if mask is not None:
                mask.accept(token.item(), "")
                if token.item() in eos_ids:  # nothing follows the end of the structure
                    break
        if mask is not None:
            masks.append(masks[-1] if token.item() in eos_ids else mask.allowed())
            mask.rollback(len(tokens))
        return mx.concatenate(tokens), mx.stack(scores), None if mask is None else mx.stack(masks)

    def _fit(self, logits: mx.array) -> mx.array:
        """The drafter's logits over the target's width: ids it lacks can never be drafted."""
        if logits.shape[-1] >= self.width:
            return logits[: self.width]
        missing = mx.full((self.width - logits.shape[-1],), -mx.inf, logits.dtype)
        return mx.concatenate([logits, missing])
