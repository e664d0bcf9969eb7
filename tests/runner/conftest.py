"""Tiny checkpoints and engines shared by the runner tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from plugd.protocol import Completion, DoneEvent, SamplingParams, TokenEvent
from plugd.runner.generate import Engine
from plugd.runner.loading import load_model
from plugd.testing.checkpoints import write_checkpoint
from plugd.tokenizer import Tokenizer
from plugd_qwen import qwen3

GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runner-checkpoints")
    return {name: write_checkpoint(root / name, name, seed=1) for name in ["qwen3", "qwen3_moe"]}


@pytest.fixture(scope="session")
def qwen3_model(checkpoints):
    return load_model(checkpoints["qwen3"], qwen3)


@pytest.fixture(scope="session")
def tokenizer(checkpoints) -> Tokenizer:
    return Tokenizer.from_dir(checkpoints["qwen3"])


@pytest.fixture
def engine(qwen3_model, tokenizer) -> Engine:
    """A fresh engine (empty prompt cache) on the shared qwen3 weights."""
    return Engine(qwen3_model, tokenizer, prefill_chunk=8)


def _request(tokens: list[int], **fields) -> Completion:
    """A completion request with test-friendly defaults (greedy, 16 tokens, a roomy context, no stops)."""
    defaults = {"sampling": GREEDY, "num_predict": 16, "num_ctx": 256, "num_keep": 0, "stop": []}
    return Completion(tokens=tokens, **(defaults | fields))


def _complete(
    engine: Engine, tokens: list[int], cancelled: Callable[[], bool] = lambda: False, **fields
) -> tuple[list[TokenEvent], DoneEvent]:
    """Run `_request(tokens, **fields)`; return its token events and its done event, checked to come last and once."""
    *events, done = engine.complete(_request(tokens, **fields), cancelled)
    assert isinstance(done, DoneEvent) and all(isinstance(event, TokenEvent) for event in events)
    return events, done


@pytest.fixture
def make_request():
    """`make_request(tokens, **request_fields) -> Completion`."""
    return _request


@pytest.fixture
def complete():
    """`complete(engine, tokens, cancelled=..., **request_fields) -> (token events, done event)`."""
    return _complete
