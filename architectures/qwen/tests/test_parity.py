"""Our qwen3 / qwen3_moe against mlx-lm's on the same tiny checkpoints: logits and greedy decode.

Float32, bfloat16 sharded, MLX-quantized (written by mlx-lm's own convert) and
transformers-5 style configs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm import convert
from mlx_lm.utils import load_model as load_reference

from plugd.nn.cache import KVCache
from plugd.nn.linear import QuantizedEmbedding, QuantizedLinear
from plugd.nn.switch import QuantizedSwitchLinear, SwitchLinear
from plugd.runner.loading import load_model
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.parity import greedy_tokens, last_logits_difference, mlx_lm_greedy_tokens
from plugd_qwen import qwen3, qwen3_moe

MODULES = {"qwen3": qwen3, "qwen3_moe": qwen3_moe}
TOLERANCE = 1e-4
PROMPT = mx.array(np.random.default_rng(7).integers(0, 512, 64), mx.int32)
DECODE_TOKENS = 32


@pytest.fixture(scope="module", params=sorted(MODULES))
def checkpoint(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, write_checkpoint(tmp_path_factory.mktemp(request.param), request.param, seed=1)


def test_full_prompt_logits_match_mlx_lm(checkpoint):
    model_type, path = checkpoint
    ours = load_model(path, MODULES[model_type])
    reference, _ = load_reference(path)
    assert last_logits_difference(ours(PROMPT[None]), reference(PROMPT[None])) <= TOLERANCE


def test_chunked_prefill_through_the_cache_matches_mlx_lm(checkpoint):
    model_type, path = checkpoint
    ours = load_model(path, MODULES[model_type])
    reference, _ = load_reference(path)
    # A small step makes the 64-token prompt outgrow the preallocated cache several times.
    cache = [KVCache(step=16) for _ in range(ours.args.num_hidden_layers)]
    for start, end in ((0, 20), (20, 41), (41, 63), (63, 64)):
        logits = ours(PROMPT[None, start:end], cache)
    assert [layer.offset for layer in cache] == [64] * len(cache)
    assert last_logits_difference(logits, reference(PROMPT[None])) <= TOLERANCE


def test_cached_greedy_decode_matches_mlx_lm_generate(checkpoint):
    model_type, path = checkpoint
    ours = load_model(path, MODULES[model_type])
    assert greedy_tokens(ours, PROMPT, DECODE_TOKENS) == mlx_lm_greedy_tokens(path, PROMPT, DECODE_TOKENS)


@pytest.mark.parametrize("model_type", sorted(MODULES))
def test_bfloat16_sharded_checkpoint_loads_into_float32(model_type, tmp_path):
    path = write_checkpoint(tmp_path, model_type, seed=2, dtype="bfloat16", shards=2)
    assert len(list(path.glob("*.safetensors"))) == 2
    ours = load_model(path, MODULES[model_type])
    assert {parameter.dtype for _, parameter in tree_flatten(ours.parameters())} == {mx.float32}
    reference, _ = load_reference(path)
    reference.set_dtype(mx.float32)  # bfloat16 -> float32 is exact, so both compute on the same weights
    assert last_logits_difference(ours(PROMPT[None]), reference(PROMPT[None])) <= TOLERANCE


@pytest.mark.parametrize("model_type", sorted(MODULES))
def test_transformers_5_config_reads_like_the_older_one(model_type, tmp_path):
    older = write_checkpoint(tmp_path / "older", model_type, seed=4)
    newer = Path(shutil.copytree(older, tmp_path / "newer"))
    config = json.loads((newer / "config.json").read_text())
    config["rope_parameters"] = {"rope_theta": config.pop("rope_theta"), "rope_type": "default"}
    if "num_experts" in config:
        config["num_local_experts"] = config.pop("num_experts")
    (newer / "config.json").write_text(json.dumps(config))
    ours = load_model(newer, MODULES[model_type])
    reference, _ = load_reference(older)  # mlx-lm 0.32 reads only the older vintage
    assert last_logits_difference(ours(PROMPT[None]), reference(PROMPT[None])) <= TOLERANCE


@pytest.fixture(scope="module", params=[(model_type, bits) for model_type in sorted(MODULES) for bits in (4, 8)])
def quantized(request, tmp_path_factory) -> tuple[str, int, Path]:
    model_type, bits = request.param
    root = tmp_path_factory.mktemp(f"{model_type}-{bits}bit")
    source = write_checkpoint(root / "float", model_type, seed=3)
    convert(str(source), str(root / "quantized"), quantize=True, q_group_size=64, q_bits=bits)
    return model_type, bits, root / "quantized"


def test_quantized_layers_follow_the_checkpoint(quantized):
    model_type, bits, path = quantized
    ours = load_model(path, MODULES[model_type])
    layer = ours.model.layers[0]
    assert isinstance(ours.model.embed_tokens, QuantizedEmbedding) and ours.model.embed_tokens.bits == bits
    assert isinstance(layer.self_attn.q_proj, QuantizedLinear) and layer.self_attn.q_proj.bits == bits
    if model_type == "qwen3_moe":
        config = json.loads((path / "config.json").read_text())
        assert config["quantization"]["model.layers.0.mlp.gate"]["bits"] == 8  # mlx-lm's per-layer override
        assert isinstance(layer.mlp.gate, QuantizedLinear) and layer.mlp.gate.bits == 8
        experts = layer.mlp.switch_mlp
        assert isinstance(experts.up_proj, QuantizedSwitchLinear) and experts.up_proj.bits == bits
        # 32 inputs do not fill a group of 64, so mlx-lm leaves the experts' down projection dense.
        assert type(experts.down_proj) is SwitchLinear


def test_quantized_logits_and_greedy_decode_match_mlx_lm(quantized):
    model_type, _, path = quantized
    ours = load_model(path, MODULES[model_type])
    reference, _ = load_reference(path)
    assert last_logits_difference(ours(PROMPT[None]), reference(PROMPT[None])) <= TOLERANCE
    assert greedy_tokens(ours, PROMPT, DECODE_TOKENS) == mlx_lm_greedy_tokens(path, PROMPT, DECODE_TOKENS)


@pytest.mark.parametrize("bits", [None, 4])
def test_tied_embeddings_project_onto_the_vocabulary(bits, tmp_path):
    path = write_checkpoint(tmp_path / "float", "qwen3", seed=6, overrides={"tie_word_embeddings": True})
    if bits:
        convert(str(path), str(tmp_path / "quantized"), quantize=True, q_group_size=64, q_bits=bits)
        path = tmp_path / "quantized"
    ours = load_model(path, qwen3)
    assert "lm_head" not in ours
    reference, _ = load_reference(path)
    assert last_logits_difference(ours(PROMPT[None]), reference(PROMPT[None])) <= TOLERANCE
