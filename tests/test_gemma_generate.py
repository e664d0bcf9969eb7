"""Gemma text models in the runner: greedy tokens through a live daemon equal mlx-lm's over a prompt longer than the
sliding window, and the runner's prompt cache (rewinding the rotating caches, or starting over where they cannot)
gives what a cold run gives."""

from __future__ import annotations

import importlib
from pathlib import Path

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

MODEL_TYPES = ["gemma3_text", "gemma4_text"]
PROMPT = np.random.default_rng(12).integers(0, 480, 120).tolist()
GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gemmas")
    # Seed 5: neither model reaches its end-of-sequence token within 32 greedy tokens of the test prompt.
    return {model_type: write_checkpoint(root / model_type, model_type, seed=5) for model_type in MODEL_TYPES}


def complete(engine: Engine, tokens: list[int], num_predict: int = 8):
    request = Completion(tokens=tokens, sampling=GREEDY, num_predict=num_predict, num_ctx=512, num_keep=0,
                                stop=[])
    *events, done = engine.complete(request, lambda: False)
    return [event.token for event in events], done


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_follow_up_and_diverging_prompts_match_cold_runs(checkpoints, model_type):
    module = importlib.import_module(plugins.load().architectures()[model_type].module)
    model, tokenizer = load_model(checkpoints[model_type], module), Tokenizer.from_dir(checkpoints[model_type])
    engine = Engine(model, tokenizer, prefill_chunk=16)
    first, _ = complete(engine, PROMPT[:70])
    follow_up = PROMPT[:70] + first + PROMPT[70:90]
    tokens, done = complete(engine, follow_up)
    assert done.prompt_eval_count == 20 + 1  # only the new tokens, and the last generated one never fed back
    assert tokens == complete(Engine(model, tokenizer), follow_up)[0]
    diverging = PROMPT[:40] + PROMPT[100:120]  # far behind what the sliding caches still hold
    assert complete(engine, diverging)[0] == complete(Engine(model, tokenizer), diverging)[0]


def mlx_lm_greedy_text(checkpoint: Path, prompt: str, count: int) -> str:
    model, tokenizer = mlx_lm.load(str(checkpoint))
    assert len(tokenizer.encode(prompt)) > 2 * 32  # twice the sliding window
    steps = mlx_lm.stream_generate(model, tokenizer, prompt=tokenizer.encode(prompt), max_tokens=count,
                                   sampler=make_sampler(temp=0.0))
    theirs = [step.token for step in steps]
    assert len(theirs) == count
    # Text of the token ids as decoded whole: mlx-lm's own streamed text drops a leading space.
    return tokenizer.decode(theirs)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_greedy_tokens_through_the_daemon_match_mlx_lm(checkpoints_server, checkpoints, model_type):
    """A first prompt, then one extending it, so the second resumes from the sliding caches the first left."""
    client = ollama.Client(host=checkpoints_server.url)
    first = "The quick brown fox jumps over the lazy dog. " * 8 + "Hello, world!"
    second = first + " And then the fox ran off into the woods, never to be seen again."
    for prompt, keep_alive in ((first, None), (second, 0)):
        ours = client.generate(model=model_type.replace("_", "-"), prompt=prompt, raw=True, keep_alive=keep_alive,
                               options={"temperature": 0, "repeat_penalty": 1.0, "num_predict": 32})
        assert ours.eval_count == 32
        assert ours.response == mlx_lm_greedy_text(checkpoints[model_type], prompt, 32)
    tokenizer = Tokenizer.from_dir(checkpoints[model_type])
    # Only the new tokens are evaluated: the first prompt's positions came back from the caches.
    assert ours.prompt_eval_count == len(tokenizer.encode(second)) - len(tokenizer.encode(first))
