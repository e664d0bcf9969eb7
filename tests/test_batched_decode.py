"""Continuous batching (plugd.runner.generate): every request decoded in a batch gives, token for token, what it
gives alone, on each architecture family's caches (KV, sliding window, recurrent).

The checkpoints are trained (plugd.testing.training) until greedy decoding reproduces each transcript with a
logit margin, so the small numerical differences a batched forward may bring cannot flip a choice. In the
batch, requests join while others decode, leave at different times (one by its num_predict, the others at
their end of turn), have prompts from a few tokens to several prefill chunks (and past the sliding window),
one is structured (its grammar masks its row alone), one samples with a seed, and one is cancelled mid-prefill.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from plugd import plugins
from plugd.protocol import Completion, GrammarSpec
from plugd.runner.cache_policy import make_policy
from plugd.runner.generate import Engine
from plugd.runner.grammar import Grammars
from plugd.runner.loading import load_model
from plugd.runner_api import GrammarVocabulary
from plugd.testing.architectures import architecture_module
from plugd.testing.decoding import (
    GREEDY,
    LONG,
    MEDIUM,
    OTHER_LONG,
    SEEDED,
    SHORT,
    STRUCTURED,
    TRANSCRIPTS,
    Outcome,
    turn,
    words,
)
from plugd.testing.training import FAST_OVERRIDES, Transcript, train_checkpoint
from plugd.tokenizer import Tokenizer

# Each family small enough to train in seconds, with every kind of layer it has (no MoE for nemotron_h: its
# expert routing does not train).
OVERRIDES = {
    "qwen3": FAST_OVERRIDES,
    "qwen3_moe": FAST_OVERRIDES,
    "qwen3_next": {"num_hidden_layers": 2},
    "qwen3_5": {"num_hidden_layers": 2},  # its multimodal positions ride in the cache list too
    "nemotron_h": {"hybrid_override_pattern": "M*M-", "num_hidden_layers": 4},
    "gemma3_text": {"num_hidden_layers": 2, "sliding_window_pattern": 2},
}


@attrs.define
class Trained:
    model: object
    tokenizer: Tokenizer
    grammars: Grammars

    def engine(self, one_at_a_time: bool = False, burst_chunks: int = 0) -> Engine:
        """An engine with the prefix-cache policy (what a runner runs when it is installed)."""
        return Engine(self.model, self.tokenizer, prefill_chunk=32, cache_policy=lambda model: make_policy(
            "plugd_prefix_cache.policy:prefix_cache", model), one_at_a_time=one_at_a_time, burst_chunks=burst_chunks)

    def request(self, transcript: Transcript, **fields) -> Completion:
        defaults = {"tokens": self.tokenizer.encode(transcript.prompt), "sampling": GREEDY, "num_predict": 80,
                    "num_ctx": 512, "num_keep": 0, "stop": []}
        return Completion(**(defaults | fields))

    def grammar(self) -> Callable:
        """A structured request's TokenMask factory: any JSON object."""
        return self.grammars.compile(GrammarSpec(("xgrammar",), "json", None)).result()


@pytest.fixture(scope="module", params=sorted(OVERRIDES))
def trained(request, tmp_path_factory, trained_checkpoints) -> Trained:
    model_type = request.param
    path = train_checkpoint(tmp_path_factory.mktemp(model_type) / "model", TRANSCRIPTS, model_type=model_type,
                            overrides=OVERRIDES[model_type], cache_dir=trained_checkpoints)
    model = load_model(Path(path), architecture_module(model_type))
    tokenizer = Tokenizer.from_dir(path)
    width = Engine(model, tokenizer).logits_width
    engines = {engine.name: engine.factory for engine in plugins.load().items.get("plugd_grammar_engines", [])}
    return Trained(model, tokenizer, Grammars(lambda: GrammarVocabulary.of(tokenizer, width), engines))


def alone(trained: Trained, request: Completion, grammar: Callable | None = None) -> Outcome:
    outcome = Outcome()
    outcome.events = list(trained.engine().complete(request, lambda: False, grammar))
    return outcome


def cancel_after(polls: int) -> Callable[[], bool]:
    count = iter(range(10**6))
    return lambda: next(count) >= polls


def test_each_request_in_a_batch_gives_what_it_gives_alone(trained):
    requests = {
        "long": trained.request(LONG),
        "short": trained.request(SHORT),
        "medium": trained.request(MEDIUM, num_predict=4),  # leaves by its budget while others decode
        "structured": trained.request(STRUCTURED),
        "seeded": trained.request(MEDIUM, sampling=SEEDED, num_predict=12),
        "other": trained.request(OTHER_LONG),
    }
    grammars = {"structured": trained.grammar()}
    expected = {name: alone(trained, request, grammars.get(name)) for name, request in requests.items()}
    assert expected["structured"].text == STRUCTURED.completion and expected["long"].text == LONG.completion

    engine = trained.engine()
    outcomes = {name: Outcome() for name in requests}

    def submit(name: str, cancelled: Callable[[], bool] = lambda: False) -> None:
        engine.submit(requests[name], lambda e: e is None or outcomes[name].events.append(e), cancelled,
                      grammars.get(name))

    cancelled = trained.request(OTHER_LONG, tokens=trained.tokenizer.encode(turn(words(50, 9))))
    dropped = Outcome()
    submit("long")
    submit("short")
    widest, steps = 0, 0
    while not engine.idle:
        if steps == 2:  # these join while the first two decode
            submit("medium")
            engine.submit(cancelled, lambda e: e is None or dropped.events.append(e), cancel_after(3))
            submit("structured")
        if steps == 12:
            submit("seeded")
            submit("other")
        engine.step()
        steps += 1
        widest = max(widest, len(engine.batch.rows))
    assert widest >= 4
    for name, outcome in outcomes.items():
        assert outcome.tokens == expected[name].tokens, name
        assert outcome.done.done_reason == expected[name].done.done_reason, name
        assert outcome.text == expected[name].text, name
    assert outcomes["medium"].done.done_reason == "length" and outcomes["long"].done.done_reason == "stop"
    assert dropped.tokens == [] and dropped.done.done_reason == "cancel"
    assert 0 < dropped.done.prompt_eval_count < len(cancelled.tokens)
    retry = Outcome()
    retry.events = list(engine.complete(cancelled, lambda: False))  # resumes where the cancelled prefill stopped
    assert retry.done.prompt_eval_count <= len(cancelled.tokens) - dropped.done.prompt_eval_count
    assert retry.tokens == alone(trained, cancelled).tokens


def first_token_steps(engine: Engine, requests: list[Completion], cancel_when_ready: Completion | None = None,
                      ) -> tuple[list[Outcome], list[int | None], Outcome]:
    """Submit `requests` together (and `cancel_when_ready`, cancelled once its prefill is done and it waits in
    the batch); step until all end. Their outcomes, the step at which each emitted its first token, and the
    cancelled one's outcome."""
    outcomes, dropped, cancel = [Outcome() for _ in requests], Outcome(), []
    for request, outcome in zip(requests, outcomes):
        engine.submit(request, lambda e, o=outcome: e is None or o.events.append(e), lambda: False)
    if cancel_when_ready is not None:
        sequence = engine.submit(cancel_when_ready, lambda e: e is None or dropped.events.append(e), lambda: bool(cancel))
    firsts: list[int | None] = [None] * len(requests)
    steps = 0
    while not engine.idle:
        engine.step()
        steps += 1
        if cancel_when_ready is not None and sequence in engine.batch.rows:
            cancel.append(True)
        firsts = [steps if first is None and o.tokens else first for first, o in zip(firsts, outcomes)]
    return outcomes, firsts, dropped


def test_a_burst_decodes_together_from_its_first_step(trained):
    requests = [trained.request(t) for t in (SHORT, LONG, MEDIUM, OTHER_LONG)]
    ready_then_cancelled = trained.request(MEDIUM, tokens=trained.tokenizer.encode(turn(words(12, 3))))
    outcomes, firsts, dropped = first_token_steps(trained.engine(burst_chunks=16), requests, ready_then_cancelled)
    assert len(set(firsts)) == 1, firsts
    for request, outcome in zip(requests, outcomes):
        assert outcome.tokens == alone(trained, request).tokens
    assert dropped.tokens == [] and dropped.done.done_reason == "cancel"
    # With room for one chunk only, the rows start decoding while the others are still being prefilled.
    _, firsts, _ = first_token_steps(trained.engine(burst_chunks=1), requests)
    assert len(set(firsts)) > 1, firsts


def test_a_finished_row_leaves_its_caches_to_the_next_turn(trained):
    engine = trained.engine()
    first = trained.request(SHORT)
    *reply, _ = engine.complete(first, lambda: False)
    answered = [*first.tokens, *(e.token for e in reply), *trained.tokenizer.encode("<|im_end|>")]
    follow_up = trained.request(SHORT, tokens=answered + trained.tokenizer.encode("\n" + turn("Hi")))
    *events, done = engine.complete(follow_up, lambda: False)
    # The first prompt, its reply and the end of turn that ended it were not evaluated again, whatever the caches.
    assert done.prompt_eval_count == len(follow_up.tokens) - len(answered)
    assert [e.token for e in events] == alone(trained, follow_up).tokens


def test_one_at_a_time_a_completion_decodes_in_the_policys_own_caches(trained):
    engine = trained.engine(one_at_a_time=True)
    for transcript in (LONG, SHORT, MEDIUM):
        request = trained.request(transcript)
        decoded_in = []
        outcome = Outcome(list(engine.complete(request, lambda seen=decoded_in: seen.append(engine.batch.layers))))
        assert outcome.tokens == alone(trained, request).tokens and outcome.text == transcript.completion
        assert all(layers is None or layers is engine.cache.layers for layers in decoded_in)
        assert engine.live_bytes() == sum(layer.nbytes for layer in engine.cache.layers)
