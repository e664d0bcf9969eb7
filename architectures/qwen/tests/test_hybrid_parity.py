"""Our qwen3_next, qwen3_5 and qwen3_5_moe against mlx-lm's on the same tiny checkpoints: logits after a chunked
prefill, greedy decode, both config vintages (flat or nested, interval or layer_types), expert layouts,
multi-token-prediction weights, and quantized checkpoints written by mlx-lm's convert and by plugd's own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import convert
from mlx_lm.utils import load_model as load_reference
from safetensors.numpy import load_file, save_file

from plugd.nn.cache import KVCache
from plugd.nn.linear import QuantizedLinear
from plugd.nn.recurrent import RecurrentCache
from plugd.runner.loading import load_model
from plugd.runner.quantize import quantize_checkpoint
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.parity import (
    chunked_prefill,
    counted_evaluations,
    greedy_tokens,
    last_logits_difference,
    mlx_lm_greedy_tokens,
)
from plugd_qwen import qwen3_5, qwen3_5_moe, qwen3_next
from plugd_qwen.positions import PositionCache

MODULES = {"qwen3_next": qwen3_next, "qwen3_5": qwen3_5, "qwen3_5_moe": qwen3_5_moe}
TOLERANCE = 1e-4
PROMPT = mx.array(np.random.default_rng(7).integers(0, 512, 200), mx.int32)
CHUNKS = ((0, 37), (37, 100), (100, 199), (199, 200))
DECODE_TOKENS = 32


@pytest.fixture(scope="module", params=sorted(MODULES))
def checkpoint(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, write_checkpoint(tmp_path_factory.mktemp(request.param), request.param, seed=1)


@pytest.fixture(scope="module")
def reference_logits(checkpoint) -> mx.array:
    reference, _ = load_reference(checkpoint[1])
    return reference(PROMPT[None])


def test_linear_and_full_attention_layers_get_their_caches(checkpoint):
    model_type, path = checkpoint
    model = load_model(path, MODULES[model_type])
    # Qwen3.5 keeps each sequence's multimodal positions in one more entry.
    positions = [PositionCache] if model_type.startswith("qwen3_5") else []
    assert [type(cache) for cache in model.make_cache()] == [RecurrentCache, KVCache] * 2 + positions


def test_chunked_prefill_logits_match_mlx_lm(checkpoint, reference_logits):
    model_type, path = checkpoint
    model = load_model(path, MODULES[model_type])
    assert last_logits_difference(chunked_prefill(model, PROMPT, CHUNKS), reference_logits) <= TOLERANCE
    assert last_logits_difference(model(PROMPT[None]), reference_logits) <= TOLERANCE


def test_cached_greedy_decode_matches_mlx_lm_generate(checkpoint):
    model_type, path = checkpoint
    model = load_model(path, MODULES[model_type])
    assert greedy_tokens(model, PROMPT, DECODE_TOKENS) == mlx_lm_greedy_tokens(path, PROMPT, DECODE_TOKENS)


def test_load_evaluates_once_with_the_multi_token_prediction_head(checkpoint):
    model_type, path = checkpoint
    assert any(name.startswith("mtp.") for name in load_file(path / "model.safetensors"))
    model, evaluations = counted_evaluations(lambda: load_model(path, MODULES[model_type]))
    assert evaluations == [1]
    assert model.drafter() is not None


def rewrite_config(source: Path, target: Path, change) -> Path:
    target = Path(shutil.copytree(source, target))
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(change(config)))
    return target


def transformers_5_next(config: dict) -> dict:
    """A Qwen3-Next config as transformers 5 writes it: rope_parameters, layer_types, num_local_experts."""
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": config.pop("rope_theta"),
                                 "partial_rotary_factor": config.pop("partial_rotary_factor")}
    interval = config.pop("full_attention_interval")
    config["layer_types"] = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                             for i in range(config["num_hidden_layers"])]
    config["num_local_experts"] = config.pop("num_experts")
    return config


def flat_qwen3_5(config: dict) -> dict:
    """A Qwen3.5 text config, flat, with layer_types only (mlx-lm would read neither as meant)."""
    text = config.pop("text_config")
    del text["full_attention_interval"]
    return {**text, "model_type": config["model_type"]}


@pytest.mark.parametrize("model_type, change", [("qwen3_next", transformers_5_next), ("qwen3_5", flat_qwen3_5)])
def test_other_config_vintages_read_the_same(model_type, change, tmp_path):
    older = write_checkpoint(tmp_path / "older", model_type, seed=4)
    newer = rewrite_config(older, tmp_path / "newer", change)
    assert MODULES[model_type].ModelArgs.from_dict(json.loads((newer / "config.json").read_text())) == \
        MODULES[model_type].ModelArgs.from_dict(json.loads((older / "config.json").read_text()))
    reference, _ = load_reference(older)  # mlx-lm 0.32 reads only the older vintage
    ours = load_model(newer, MODULES[model_type])
    assert last_logits_difference(ours(PROMPT[None]), reference(PROMPT[None])) <= TOLERANCE


def test_per_expert_tensors_read_like_fused_ones(tmp_path):
    fused = write_checkpoint(tmp_path / "fused", "qwen3_5_moe", seed=5)
    split = Path(shutil.copytree(fused, tmp_path / "split"))
    tensors = load_file(split / "model.safetensors")
    for name in [name for name in tensors if name.endswith("experts.gate_up_proj")]:
        prefix = name.removesuffix("gate_up_proj")
        gate, up = np.split(tensors.pop(name), 2, axis=-2)
        down = tensors.pop(prefix + "down_proj")
        for e in range(gate.shape[0]):
            tensors |= {f"{prefix}{e}.gate_proj.weight": gate[e], f"{prefix}{e}.up_proj.weight": up[e],
                        f"{prefix}{e}.down_proj.weight": down[e]}
    save_file(tensors, split / "model.safetensors")
    assert mx.array_equal(load_model(split, qwen3_5_moe)(PROMPT[None]), load_model(fused, qwen3_5_moe)(PROMPT[None]))


@pytest.fixture(scope="module", params=["qwen3_next", "qwen3_5_moe"])
def converted(request, tmp_path_factory) -> tuple[str, Path]:
    """A 4-bit checkpoint written by mlx-lm's convert (experts stacked, norms and kernels folded, routers at 8 bits)."""
    root = tmp_path_factory.mktemp(f"{request.param}-4bit")
    source = write_checkpoint(root / "float", request.param, seed=3)
    convert(str(source), str(root / "q"), quantize=True, q_group_size=64, q_bits=4)
    return request.param, root / "q"


def test_mlx_lm_quantized_checkpoints_match_mlx_lm(converted):
    model_type, path = converted
    model = load_model(path, MODULES[model_type])
    text = model if model_type == "qwen3_next" else model.language_model
    layer = text.model.layers[0]
    packed = model_type == "qwen3_next"
    projection = layer.linear_attn.in_proj_qkvz if packed else layer.linear_attn.in_proj_qkv
    assert isinstance(projection, QuantizedLinear) and projection.bits == 4
    assert isinstance(layer.mlp.gate, QuantizedLinear) and layer.mlp.gate.bits == 8
    assert isinstance(layer.mlp.shared_expert.up_proj, QuantizedLinear) and layer.mlp.shared_expert.up_proj.bits == 4
    assert model.drafter() is None  # mlx-lm's conversion leaves the multi-token-prediction head out
    reference, _ = load_reference(path)
    assert last_logits_difference(chunked_prefill(model, PROMPT, CHUNKS), reference(PROMPT[None])) <= TOLERANCE
    assert greedy_tokens(model, PROMPT, DECODE_TOKENS) == mlx_lm_greedy_tokens(path, PROMPT, DECODE_TOKENS)


def test_plugd_quantized_checkpoint_reloads_and_mlx_lm_reads_it(tmp_path):
    source = write_checkpoint(tmp_path / "float", "qwen3_5", seed=3)
    quantize_checkpoint(source, tmp_path / "q", qwen3_5, bits=4)
    model = load_model(tmp_path / "q", qwen3_5)
    assert isinstance(model.language_model.model.layers[0].linear_attn.in_proj_qkv, QuantizedLinear)
    assert isinstance(model.language_model.mtp.fc, QuantizedLinear)  # the head is kept, quantized like the rest
    reference, _ = load_reference(tmp_path / "q")
    assert last_logits_difference(chunked_prefill(model, PROMPT, CHUNKS), reference(PROMPT[None])) <= TOLERANCE
