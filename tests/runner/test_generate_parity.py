"""The engine's decode against mlx-lm's on the same tiny checkpoints, and seeded sampling."""

from __future__ import annotations

import attrs
import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx_lm.sample_utils import make_sampler

from plugd.protocol import SamplingParams
from plugd.runner.generate import Engine
from plugd.runner.loading import load_model
from plugd.tokenizer import Tokenizer
from plugd_qwen import qwen3, qwen3_moe

MODULES = {"qwen3": qwen3, "qwen3_moe": qwen3_moe}

PROMPT = np.random.default_rng(7).integers(0, 480, 40).tolist()
DECODE_TOKENS = 32


@pytest.mark.parametrize("model_type", sorted(MODULES))
def test_greedy_tokens_match_mlx_lm_stream_generate(model_type, checkpoints, complete):
    path = checkpoints[model_type]
    engine = Engine(load_model(path, MODULES[model_type]), Tokenizer.from_dir(path), prefill_chunk=16)
    events, done = complete(engine, PROMPT, num_predict=DECODE_TOKENS)

    model, tokenizer = mlx_lm.load(str(path))
    prompt = mx.array(PROMPT, mx.int32)
    greedy = make_sampler(temp=0.0)
    reference = list(mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=DECODE_TOKENS, sampler=greedy))
    assert reference[-1].finish_reason == "length" and done.done_reason == "length"  # no early end-of-sequence
    assert [event.token for event in events] == [response.token for response in reference]
    assert "".join(event.text for event in events) + done.text == tokenizer.decode([r.token for r in reference])


SAMPLED = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, min_p=0.02, repeat_penalty=1.1, seed=42)


def test_seeded_sampling_repeats_and_seeds_differ(engine, complete):
    def tokens(params: SamplingParams) -> list[int]:
        events, _ = complete(engine, PROMPT, sampling=params, num_predict=24)
        return [event.token for event in events]

    first = tokens(SAMPLED)
    assert len(first) == 24
    assert tokens(SAMPLED) == first
    assert tokens(attrs.evolve(SAMPLED, seed=43)) != first
    greedy, _ = complete(engine, PROMPT, num_predict=24)
    assert first != [event.token for event in greedy]
