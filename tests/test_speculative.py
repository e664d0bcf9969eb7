"""Speculative decoding in the engine (plugd.runner.speculative): drafted tokens never change the answer.

A target of each cache family (KV, sliding window, recurrent) decodes with a
small draft trained on the same transcripts (which agrees with it there and
not elsewhere) and with an untrained one (which it mostly refuses): greedy
output, log-probabilities, stops and budgets come out exactly as plain
decoding gives them, while rows join and leave, and through the prefix
cache's resumes. Sampled output is checked against the target's own
distribution.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import attrs
import mlx.core as mx
import numpy as np
import pytest
from scipy import stats

from plugd import plugins
from plugd.protocol import Completion, GrammarSpec, SamplingParams, TokenEvent
from plugd.runner.cache_policy import make_policy
from plugd.runner.drafting import Drafter, DraftModel, drafter_of
from plugd.runner.generate import Engine
from plugd.runner.grammar import Grammars
from plugd.runner.loading import load_model
from plugd.runner_api import GrammarVocabulary
from plugd.testing.architectures import architecture_module
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.decoding import (
    GREEDY,
    LONG,
    MEDIUM,
    OTHER_LONG,
    SHORT,
    STRUCTURED,
    TRANSCRIPTS,
    Outcome,
    turn,
    words,
)
from plugd.testing.training import FAST_OVERRIDES, train_checkpoint, train_mtp_head
from plugd.tokenizer import Tokenizer

TARGETS = {
    "qwen3": FAST_OVERRIDES,
    "qwen3_next": {"num_hidden_layers": 2},
    "nemotron_h": {"hybrid_override_pattern": "M*M-", "num_hidden_layers": 4},
    "gemma3_text": {"num_hidden_layers": 2, "sliding_window_pattern": 2},
}
# A draft a fifth of FAST_OVERRIDES' qwen3 in weights, most of them its tied embedding.
DRAFT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 1,
         "num_key_value_heads": 1, "head_dim": 32, "tie_word_embeddings": True}
# Targets with a multi-token-prediction head of their own (plugd.nn.mtp).
MTP_TARGETS = {"qwen3_next": {"num_hidden_layers": 2}, "qwen3_5": {"num_hidden_layers": 2}}
OFF_SCRIPT = turn(words(30, 11))  # a prompt neither model was trained on


@attrs.define
class Pair:
    """A target and two drafters: one that learnt what the target did (`trained`), one that did not. An MTP head
    belongs to its model, so each drafter has its target (the same but for the head)."""

    targets: dict[str, object]
    drafters: dict[str, Drafter]
    tokenizer: Tokenizer
    grammars: Grammars

    def engine(self, draft: str, drafting: bool = True, **options) -> Engine:
        """An engine with the prefix-cache policy. Its drafter is taken to cost nothing beside the target, as a
        real one costs little beside a real model (these tiny ones cost a fifth to half of theirs, for which the
        depth would mostly be 0): how deep to draft is left to acceptance alone."""
        engine = Engine(self.targets[draft], self.tokenizer, prefill_chunk=32,
                        drafter=self.drafters[draft] if drafting else None, cache_policy=lambda model:
                        make_policy("plugd_prefix_cache.policy:prefix_cache", model), **options)
        if engine.speculator is not None:
            engine.speculator.cost = 0.0
        return engine

    def plain(self, draft: str) -> Engine:
        """An engine on the same target that does not draft."""
        return self.engine(draft, drafting=False)

    def request(self, prompt: str, **fields) -> Completion:
        defaults = {"tokens": self.tokenizer.encode(prompt), "sampling": GREEDY, "num_predict": 40, "num_ctx": 512,
                    "num_keep": 0, "stop": [], "logprobs": True, "top_logprobs": 3}
        return Completion(**(defaults | fields))


@pytest.fixture(scope="module")
def drafts(tmp_path_factory, trained_checkpoints) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("drafts")
    return {"trained": train_checkpoint(root / "trained", TRANSCRIPTS, overrides=DRAFT, cache_dir=trained_checkpoints),
            "untrained": write_checkpoint(root / "untrained", "qwen3", seed=3, overrides=DRAFT)}


@pytest.fixture(scope="module", params=[*(f"{model_type}+draft" for model_type in sorted(TARGETS)),
                                        *(f"{model_type}+mtp" for model_type in sorted(MTP_TARGETS))])
def pair(request, tmp_path_factory, trained_checkpoints, drafts) -> Pair:
    model_type, drafter = request.param.split("+")
    module = architecture_module(model_type)
    overrides = (TARGETS if drafter == "draft" else MTP_TARGETS)[model_type]
    path = train_checkpoint(tmp_path_factory.mktemp(model_type) / "model", TRANSCRIPTS, model_type=model_type,
                            overrides=overrides, cache_dir=trained_checkpoints)
    if drafter == "draft":
        target, qwen3 = load_model(path, module), architecture_module("qwen3")
        targets = {"trained": target, "untrained": target}
        drafters = {name: DraftModel(load_model(drafts[name], qwen3)) for name in drafts}
    else:  # the body trained, its head as written; then a copy whose head learnt the body's answers
        trained = train_mtp_head(shutil.copytree(path, path.parent / "head"), TRANSCRIPTS)
        targets = {"trained": load_model(trained, module), "untrained": load_model(path, module)}
        drafters = {name: drafter_of(target, None) for name, target in targets.items()}
    tokenizer = Tokenizer.from_dir(path)
    width = Engine(targets["trained"], tokenizer).logits_width
    engines = {engine.name: engine.factory for engine in plugins.load().items.get("plugd_grammar_engines", [])}
    return Pair(targets, drafters, tokenizer, Grammars(lambda: GrammarVocabulary.of(tokenizer, width), engines))


def complete(engine: Engine, request: Completion) -> Outcome:
    return Outcome(list(engine.complete(request, lambda: False)))


def same(outcome: Outcome, expected: Outcome) -> bool:
    """The same tokens, texts and ending, and log-probabilities equal but for float32 rounding (a verifying pass
    scores several positions in one product, a plain step one)."""
    def facts(o: Outcome) -> list:
        done = o.done
        tokens = [(e.token, e.text, [t for t, _ in e.top_logprobs or []]) for e in o.events[:-1]]
        return [*tokens, (done.done_reason, done.text, done.stop_sequence, done.eval_count)]

    def logprobs(o: Outcome) -> np.ndarray:
        return np.array([lp for e in o.events[:-1] for lp in [e.logprob, *(lp for _, lp in e.top_logprobs or [])]])

    return facts(outcome) == facts(expected) and np.allclose(logprobs(outcome), logprobs(expected), atol=1e-4)


def test_greedy_output_is_plain_decodings(pair):
    prompts = [t.prompt for t in TRANSCRIPTS] + [OFF_SCRIPT]
    acceptance = {}
    for name in ("trained", "untrained"):
        engine = pair.engine(name)
        for prompt in prompts:
            request = pair.request(prompt, sampling=SamplingParams(temperature=0.0))  # Ollama's repeat penalty on
            assert same(complete(engine, request), complete(pair.plain(name), request)), (name, prompt)
        assert engine.speculator.drafted > 0
        acceptance[name] = engine.speculator.kept / engine.speculator.drafted
    # Kept: the trained drafter's guesses often (less the deeper an MTP head drafts on its own), the other's seldom.
    assert acceptance["trained"] > 0.4 and acceptance["untrained"] < 0.2, acceptance


def test_stops_and_budgets_end_inside_a_round(pair):
    engine = pair.engine("trained")
    requests = [pair.request(LONG.prompt, stop=["quiet"]),  # a stop string part-way through the answer
                pair.request(MEDIUM.prompt, num_predict=7),
                pair.request(SHORT.prompt, num_predict=1),
                pair.request(OTHER_LONG.prompt)]  # to the end of turn
    for request in requests:
        assert same(complete(engine, request), complete(pair.plain("trained"), request)), request.stop or request.num_predict


@pytest.mark.parametrize("grammar_engine", ["llguidance", "xgrammar"])
def test_a_structured_request_drafts_under_its_grammar(pair, grammar_engine):
    request = pair.request(STRUCTURED.prompt)
    mask = pair.grammars.compile(GrammarSpec((grammar_engine,), "json", None)).result()
    for name in ("trained", "untrained"):
        engine = pair.engine(name)
        drafting = Outcome(list(engine.complete(request, lambda: False, mask)))
        plain = Outcome(list(pair.plain(name).complete(request, lambda: False, mask)))
        assert same(drafting, plain) and json.loads(drafting.text)
        assert engine.speculator.drafted > 0
    assert engine.speculator.kept < engine.speculator.drafted  # the untrained draft's guesses were refused


def test_rows_join_and_leave_a_drafting_row(pair):
    engine = pair.engine("trained")
    first, second = pair.request(LONG.prompt), pair.request(MEDIUM.prompt, num_predict=6)
    outcomes = {"first": Outcome(), "second": Outcome()}
    engine.submit(first, lambda e: e is None or outcomes["first"].events.append(e), lambda: False)
    steps = 0
    while not engine.idle:
        if steps == 4:  # joins while the first drafts, and leaves before it ends: it drafts again alone
            engine.submit(second, lambda e: e is None or outcomes["second"].events.append(e), lambda: False)
        engine.step()
        steps += 1
    assert same(outcomes["first"], complete(pair.plain("trained"), first))
    assert same(outcomes["second"], complete(pair.plain("trained"), second))


def test_the_prefix_cache_resumes_the_draft_with_the_target(pair):
    engine = pair.engine("trained")
    request = pair.request(LONG.prompt)
    polls = iter(range(10**6))
    cancelled = list(engine.complete(request, lambda: next(polls) >= 2))  # cancelled after its first chunks
    assert cancelled[-1].done_reason == "cancel" and 0 < cancelled[-1].prompt_eval_count < len(request.tokens)
    retried = complete(engine, request)
    assert retried.done.prompt_eval_count <= len(request.tokens) - cancelled[-1].prompt_eval_count
    assert same(retried, complete(pair.plain("trained"), request))
    # The next turn resumes after the reply, the draft's caches with the target's.
    answered = [*request.tokens, *retried.tokens, *pair.tokenizer.encode("<|im_end|>")]
    follow_up = pair.request(SHORT.prompt, tokens=answered + pair.tokenizer.encode("\n" + SHORT.prompt))
    resumed = complete(engine, follow_up)
    assert resumed.done.prompt_eval_count <= len(follow_up.tokens) - len(request.tokens)
    assert same(resumed, complete(pair.plain("trained"), follow_up))


def test_a_draft_that_sat_out_is_level_again_when_the_policy_takes_the_caches(pair):
    """A draft model does not follow plain decode steps (here: drafting turned off for the request); it catches
    up before the row's caches go back to the cache policy, and the next turn drafts from there."""
    engine = pair.engine("trained")
    request = pair.request(LONG.prompt, draft_tokens=0)
    plain = complete(engine, request)
    assert engine.speculator.drafted == 0
    assert len({layer.offset for layer in engine.cache.layers}) == 1
    answered = [*request.tokens, *plain.tokens, *pair.tokenizer.encode("<|im_end|>")]
    follow_up = pair.request(SHORT.prompt, tokens=answered + pair.tokenizer.encode("\n" + SHORT.prompt))
    assert same(complete(engine, follow_up), complete(pair.plain("trained"), follow_up))
    assert engine.speculator.drafted > 0


def test_a_seeded_request_samples_the_same_text_again(pair):
    sampling = SamplingParams(temperature=3.0, top_k=0, top_p=1.0, seed=11)  # hot enough to leave the script
    request = pair.request(OFF_SCRIPT, sampling=sampling, num_predict=24)
    once = complete(pair.engine("untrained"), request)
    assert same(complete(pair.engine("untrained"), request), once)
    reseeded = attrs.evolve(request, sampling=attrs.evolve(sampling, seed=12))
    assert not same(complete(pair.engine("untrained"), reseeded), once)


SAMPLES = 800
SAMPLING = SamplingParams(temperature=0.3, top_k=0, top_p=1.0, repeat_penalty=1.0)


def test_sampled_tokens_follow_the_targets_distribution(tmp_path):
    """Each token a drafting engine samples follows the target's distribution (a chi-square test on the first two
    tokens of many seeded samples), while the draft's own distribution fails the same test."""
    qwen3 = architecture_module("qwen3")
    target = load_model(write_checkpoint(tmp_path / "target", "qwen3", seed=1), qwen3)
    draft = load_model(write_checkpoint(tmp_path / "draft", "qwen3", seed=2, overrides=DRAFT), qwen3)
    tokenizer = Tokenizer.from_dir(tmp_path / "target")
    prompt = tokenizer.encode(turn("hello"))
    engine = Engine(target, tokenizer, drafter=DraftModel(draft))
    samples = np.array([_padded([e.token for e in engine.complete(Completion(
        tokens=prompt, sampling=attrs.evolve(SAMPLING, seed=seed), num_predict=2, num_ctx=64), lambda: False)
        if isinstance(e, TokenEvent)], 2) for seed in range(SAMPLES)])
    assert engine.speculator.drafted >= SAMPLES // 2 and 0 < engine.speculator.kept < engine.speculator.drafted
    ends = sorted(tokenizer.eos_ids)
    first, second = _distributions(target, prompt, ends)
    assert _fits(samples[:, 0], first) > 1e-3
    assert _fits(samples[samples[:, 0] != END, 1], second) > 1e-3
    draft_first, _ = _distributions(draft, prompt, ends)
    assert _fits(np.random.default_rng(0).choice(len(draft_first), SAMPLES, p=draft_first), first) < 1e-6


END = -1  # a generation that ended (an end-of-sequence token, which is never emitted) in its place


def _padded(tokens: list[int], length: int) -> list[int]:
    return tokens + [END] * (length - len(tokens))


def _distributions(model, prompt: list[int], ends: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The exact distributions of the first and second tokens sampled with SAMPLING after `prompt` (the second
    where the first did not end the generation), every end-of-sequence token's share in the last bin (END)."""
    first = _ending(_softmax(model(mx.array(prompt)[None])[0, -1]), ends)
    likely = np.flatnonzero(first[:-1] > 1e-6)
    continued = mx.array([[*prompt, int(token)] for token in likely])
    second = (first[likely, None] * _ending(_softmax(model(continued)[:, -1]), ends)).sum(axis=0)
    return first, second / second.sum()


def _softmax(logits: mx.array) -> np.ndarray:
    probabilities = np.array(mx.softmax(logits.astype(mx.float32) / SAMPLING.temperature, axis=-1), np.float64)
    return probabilities / probabilities.sum(axis=-1, keepdims=True)


def _ending(probabilities: np.ndarray, ends: list[int]) -> np.ndarray:
    """`probabilities` with the end-of-sequence tokens' moved to a last entry (index END)."""
    ended = probabilities[..., ends].sum(axis=-1, keepdims=True)
    kept = probabilities.copy()
    kept[..., ends] = 0
    return np.concatenate([kept, ended], axis=-1)


def _fits(samples: np.ndarray, distribution: np.ndarray) -> float:
    """The chi-square test's p-value for `samples` drawn from `distribution`, tokens expected fewer than 5 times
    pooled into one bin."""
    expected = distribution * len(samples)
    counts = np.bincount(samples % len(distribution), minlength=len(distribution))  # END counts in the last bin
    common = expected >= 5
    observed = np.append(counts[common], counts[~common].sum())
    wanted = np.append(expected[common], expected[~common].sum())
    return stats.chisquare(observed, wanted * observed.sum() / wanted.sum()).pvalue


def test_the_buffer_pool_is_released_when_a_round_crosses_a_multiple_of_256(tmp_path, monkeypatch):
    """MLX's pool of freed buffers goes back every 256 positions decoded, also where a round of several tokens
    steps over the multiple rather than onto it."""
    qwen3 = architecture_module("qwen3")
    target = load_model(write_checkpoint(tmp_path / "target", "qwen3", seed=1), qwen3)
    from_dir = Tokenizer.from_dir(tmp_path / "target")
    tokenizer = Tokenizer(from_dir._tokenizer, eos_ids=())  # a random model's stray end of turn ends nothing here
    engine = Engine(target, tokenizer, drafter=DraftModel(target))  # a draft that always agrees: rounds of 8
    engine.speculator.cost = 0.0
    released, rounds = [], []
    monkeypatch.setattr(mx, "clear_cache", lambda: released.append(len(rounds)))
    round_ = engine.speculator.round
    monkeypatch.setattr(engine.speculator, "round", lambda *args: rounds.append(round_(*args)) or rounds[-1])
    request = Completion(tokens=tokenizer.encode(turn("hello")), sampling=GREEDY, num_predict=300, num_ctx=512)
    events = list(engine.complete(request, lambda: False))
    assert events[-1].eval_count == 300 and engine.speculator.kept > 250  # nearly every token drafted and kept
    # Once, after the round that fed the 256th position (in about 40 rounds: counting steps, none would have).
    assert len(released) == 1 and sum(rounds[: released[0] - 1]) < 256 <= sum(rounds[: released[0]])
