"""Our nemotron_h against mlx-lm's on the same tiny checkpoints (every layer kind: Mamba2, attention, MLP, MoE with
grouped routing): logits after a chunked prefill, greedy decode, both config vintages, transformers 5's tensor
layout, multi-token-prediction weights, MLX-quantized checkpoints, and a load that evaluates once."""

from __future__ import annotations

import json
import re
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
from plugd.runner.loading import CheckpointError, load_model
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.parity import (
    chunked_prefill,
    counted_evaluations,
    greedy_tokens,
    last_logits_difference,
    mlx_lm_greedy_tokens,
)
from plugd_nemotron import nemotron_h

TOLERANCE = 1e-4
PROMPT = mx.array(np.random.default_rng(7).integers(0, 512, 200), mx.int32)
CHUNKS = ((0, 37), (37, 100), (100, 199), (199, 200))
DECODE_TOKENS = 32


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("nemotron_h"), "nemotron_h", seed=1)


@pytest.fixture(scope="module")
def reference_logits(checkpoint) -> mx.array:
    reference, _ = load_reference(checkpoint)
    return reference(PROMPT[None])


def test_caches_follow_the_layer_pattern(checkpoint):
    model = load_model(checkpoint, nemotron_h)
    assert model.args.pattern == "ME*M-M"
    assert [type(cache) for cache in model.make_cache()] == [RecurrentCache, KVCache, RecurrentCache, RecurrentCache]


def test_chunked_prefill_logits_match_mlx_lm(checkpoint, reference_logits):
    model = load_model(checkpoint, nemotron_h)
    assert last_logits_difference(chunked_prefill(model, PROMPT, CHUNKS), reference_logits) <= TOLERANCE
    assert last_logits_difference(model(PROMPT[None]), reference_logits) <= TOLERANCE


def test_cached_greedy_decode_matches_mlx_lm_generate(checkpoint):
    model = load_model(checkpoint, nemotron_h)
    assert greedy_tokens(model, PROMPT, DECODE_TOKENS) == mlx_lm_greedy_tokens(checkpoint, PROMPT, DECODE_TOKENS)


def test_load_evaluates_once(checkpoint):
    model, evaluations = counted_evaluations(lambda: load_model(checkpoint, nemotron_h))
    assert evaluations == [1]
    assert model.backbone.layers[1].mixer.switch_mlp.fc1.weight.shape == (8, 32, 64)


def transformers_5_copy(source: Path, target: Path) -> Path:
    """`source` as transformers 5 may write it: layer kinds as a list (with older spellings), renamed keys, a
    `model.` prefix and fused 3-D expert tensors."""
    target = Path(shutil.copytree(source, target))
    config = json.loads((target / "config.json").read_text())
    names = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    config["layers_block_type"] = [names[kind] for kind in config.pop("hybrid_override_pattern")]
    config["num_local_experts"] = config.pop("n_routed_experts")
    config["mamba_d_conv"], config["mamba_n_groups"] = config.pop("conv_kernel"), config.pop("n_groups")
    (target / "config.json").write_text(json.dumps(config))
    tensors = load_file(target / "model.safetensors")
    renamed = {re.sub(r"^backbone\.", "model.", name): tensor for name, tensor in tensors.items()}
    for projection in ("up_proj", "down_proj"):
        per_expert = sorted(name for name in renamed if re.search(rf"experts\.\d+\.{projection}", name))
        stacked = np.stack([renamed.pop(name) for name in sorted(per_expert, key=lambda n: int(n.split(".")[-3]))])
        renamed[f"model.layers.1.mixer.experts.{projection}"] = stacked
    save_file(renamed, target / "model.safetensors")
    return target


def test_transformers_5_config_and_layout_read_like_the_hub_ones(checkpoint, reference_logits, tmp_path):
    model = load_model(transformers_5_copy(checkpoint, tmp_path / "newer"), nemotron_h)
    assert last_logits_difference(model(PROMPT[None]), reference_logits) <= TOLERANCE


def test_multi_token_prediction_weights_are_dropped(reference_logits, tmp_path):
    path = write_checkpoint(tmp_path, "nemotron_h", seed=1, overrides={"num_nextn_predict_layers": 1})
    assert any(name.startswith("mtp.") for name in load_file(path / "model.safetensors"))
    assert last_logits_difference(load_model(path, nemotron_h)(PROMPT[None]), reference_logits) <= TOLERANCE


def test_linear_biases_are_refused(tmp_path):
    path = write_checkpoint(tmp_path, "nemotron_h", overrides={"mlp_bias": True})
    with pytest.raises(ValueError, match="mlp_bias"):
        load_model(path, nemotron_h)


def test_a_checkpoint_missing_a_mamba_tensor_is_named(checkpoint, tmp_path):
    path = Path(shutil.copytree(checkpoint, tmp_path / "broken"))
    tensors = load_file(path / "model.safetensors")
    del tensors["backbone.layers.3.mixer.A_log"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=re.escape("missing tensor backbone.layers.3.mixer.A_log")):
        load_model(path, nemotron_h)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nemotron_h-4bit")
    # Seed 2: greedy decoding of the quantized model does not reach an end-of-sequence token within 32 tokens.
    convert(str(write_checkpoint(root / "float", "nemotron_h", seed=2)), str(root / "q"), quantize=True,
            q_group_size=64, q_bits=4)
    return root / "q"


def test_quantized_checkpoint_matches_mlx_lm(quantized):
    model = load_model(quantized, nemotron_h)
    mamba = model.backbone.layers[0].mixer
    assert isinstance(mamba.in_proj, QuantizedLinear) and mamba.in_proj.bits == 4
    reference, _ = load_reference(quantized)
    assert last_logits_difference(chunked_prefill(model, PROMPT, CHUNKS), reference(PROMPT[None])) <= TOLERANCE
    assert greedy_tokens(model, PROMPT, DECODE_TOKENS) == mlx_lm_greedy_tokens(quantized, PROMPT, DECODE_TOKENS)
