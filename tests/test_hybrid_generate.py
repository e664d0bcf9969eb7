"""Hybrid (recurrent + attention) models in the runner: greedy tokens through a live daemon equal mlx-lm's, a prompt
that extends the previous one resumes from the recurrent state, and snapshots restore the state exactly."""

from __future__ import annotations

import importlib
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
import ollama
import pytest
from mlx_lm.sample_utils import make_sampler

from plugd import plugins
from plugd.protocol import Completion, SamplingParams
from plugd.runner.generate import Engine
from plugd.runner.loading import load_model
from plugd.testing.checkpoints import write_checkpoint
from plugd.tokenizer import Tokenizer

MODEL_TYPES = ["nemotron_h", "qwen3_next", "qwen3_5", "qwen3_5_moe"]
PROMPT = np.random.default_rng(11).integers(0, 480, 64).tolist()
GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hybrids")
    return {model_type: write_checkpoint(root / model_type, model_type, seed=3) for model_type in MODEL_TYPES}


def load(path: Path, model_type: str):
    """The model as the runner loads it: through the architecture its plugin registers."""
    module = importlib.import_module(plugins.load().architectures()[model_type].module)
    return load_model(path, module)


def complete(engine: Engine, tokens: list[int], num_predict: int = 8):
    request = Completion(tokens=tokens, sampling=GREEDY, num_predict=num_predict, num_ctx=256, num_keep=0,
                                stop=[])
    *events, done = engine.complete(request, lambda: False)
    return [event.token for event in events], done


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5"])
def test_a_follow_up_turn_resumes_the_recurrent_state(checkpoints, model_type):
    model, tokenizer = load(checkpoints[model_type], model_type), Tokenizer.from_dir(checkpoints[model_type])
    engine = Engine(model, tokenizer, prefill_chunk=16)
    first, _ = complete(engine, PROMPT[:30])
    follow_up = PROMPT[:30] + first + PROMPT[30:50]
    tokens, done = complete(engine, follow_up)
    # Only the new tokens are evaluated (and the last generated one, which was never fed back).
    assert done.prompt_eval_count == 20 + 1
    cold, cold_done = complete(Engine(model, tokenizer, prefill_chunk=16), follow_up)
    assert cold_done.prompt_eval_count == len(follow_up)
    assert tokens == cold


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5"])
def test_a_diverging_prompt_still_matches_a_cold_run(checkpoints, model_type):
    model, tokenizer = load(checkpoints[model_type], model_type), Tokenizer.from_dir(checkpoints[model_type])
    engine = Engine(model, tokenizer, prefill_chunk=16)
    complete(engine, PROMPT[:40])
    diverging = PROMPT[:20] + PROMPT[44:60]
    tokens, _ = complete(engine, diverging)
    assert tokens == complete(Engine(model, tokenizer), diverging)[0]


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_a_snapshot_taken_after_the_prompt_restores_the_state_for_another_continuation(checkpoints, model_type):
    model = load(checkpoints[model_type], model_type)
    prompt = mx.array(PROMPT[:40], mx.int32)[None]
    cache = model.make_cache()
    model(prompt, cache)
    snapshot = [layer.state for layer in cache]
    model(mx.array(PROMPT[40:52], mx.int32)[None], cache)  # a first continuation moves every layer on
    assert all(layer.offset == 52 for layer in cache)
    for layer, state in zip(cache, snapshot, strict=True):
        layer.state = state
    other = mx.array(PROMPT[52:64], mx.int32)[None]
    resumed = model(other, cache)
    cold = model(mx.concatenate([prompt, other], axis=1))
    assert mx.allclose(resumed[0, -1], cold[0, -1], atol=1e-5)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_greedy_tokens_through_the_daemon_match_mlx_lm(checkpoints_server, checkpoints, model_type):
    client = ollama.Client(host=checkpoints_server.url)
    prompt = "The quick brown fox jumps over the lazy dog. " * 6 + "Hello, world!"
    ours = client.generate(model=model_type.replace("_", "-"), prompt=prompt, raw=True, keep_alive=0,
                           options={"temperature": 0, "repeat_penalty": 1.0, "num_predict": 32})
    assert ours.eval_count == 32
    model, tokenizer = mlx_lm.load(str(checkpoints[model_type]))
    steps = mlx_lm.stream_generate(model, tokenizer, prompt=tokenizer.encode(prompt), max_tokens=32,
                                   sampler=make_sampler(temp=0.0))
    theirs = [step.token for step in steps]
    assert len(theirs) == 32
    assert ours.response == tokenizer.decode(theirs)
