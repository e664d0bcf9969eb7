"""Our gemma3_text / gemma4_text against mlx-lm's on the same tiny checkpoints: logits after a 200-token prompt
(longer than the 32-position sliding window, so the rotating caches drop positions), greedy decoding, both config
vintages, variants the default tiny configs leave out, and a quantized checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import convert
from mlx_lm.utils import load_model as load_reference

from plugd.nn.cache import KVCache
from plugd.nn.linear import QuantizedLinear
from plugd.nn.rotating import RotatingKVCache
from plugd.runner.loading import load_model
from plugd.testing.checkpoints import BASE_CONFIGS, write_checkpoint
from plugd.testing.parity import chunked_prefill, greedy_tokens, last_logits_difference, mlx_lm_greedy_tokens
from plugd_gemma import gemma3, gemma3_text, gemma4_text

# gemma3 (the vision model) is compared on text alone here, with mlx-lm's gemma3; its images in test_vision.py.
MODULES = {"gemma3_text": gemma3_text, "gemma4_text": gemma4_text, "gemma3": gemma3}
TEXT_MODULES = ("gemma3_text", "gemma4_text")
TOLERANCE = 1e-4
PROMPT = mx.array(np.random.default_rng(7).integers(0, 512, 200), mx.int32)
CHUNKS = ((0, 45), (45, 90), (90, 91), (91, 160), (160, 199), (199, 200))
DECODE_TOKENS = 32


@pytest.fixture(scope="module", params=sorted(MODULES))
def checkpoint(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, write_checkpoint(tmp_path_factory.mktemp(request.param), request.param, seed=1)


@pytest.fixture(scope="module")
def loaded(checkpoint):
    model_type, path = checkpoint
    ours, reference = load_model(path, MODULES[model_type]), load_reference(path)[0]
    return ours, reference, reference(PROMPT[None])


def test_full_prompt_logits_match_mlx_lm(loaded):
    ours, _, expected = loaded
    assert last_logits_difference(ours(PROMPT[None]), expected) <= TOLERANCE


def test_chunked_prefill_through_rotating_caches_matches_mlx_lm(loaded):
    ours, _, expected = loaded
    cache = ours.make_cache()
    assert {type(layer) for layer in cache} == {KVCache, RotatingKVCache}
    assert last_logits_difference(chunked_prefill(ours, PROMPT, CHUNKS, cache), expected) <= TOLERANCE


def small_caches(model, slack: int, step: int) -> list:
    """The model's caches, with sliding ones that keep `slack` positions beyond the window and grow `step` at a time."""
    return [RotatingKVCache(layer.window, slack=slack, step=step) if isinstance(layer, RotatingKVCache) else layer
            for layer in model.make_cache()]


def test_compacting_often_changes_nothing(loaded):
    """No slack and a one-position step: the sliding caches drop old positions at almost every write."""
    ours, _, expected = loaded
    cache = small_caches(ours, slack=0, step=1)
    logits = chunked_prefill(ours, PROMPT, CHUNKS, cache)
    for token in PROMPT[:3].tolist():
        logits = ours(mx.array([[token]], mx.int32), cache)
    longer = mx.concatenate([PROMPT, PROMPT[:3]])
    assert last_logits_difference(logits, ours(longer[None])) <= TOLERANCE
    assert all(layer.stored <= layer.window + 1 for layer in cache if isinstance(layer, RotatingKVCache))


def test_cached_greedy_decode_matches_mlx_lm_generate(checkpoint, loaded):
    _, path = checkpoint
    ours, _, _ = loaded
    assert greedy_tokens(ours, PROMPT, DECODE_TOKENS) == mlx_lm_greedy_tokens(path, PROMPT, DECODE_TOKENS)


def test_trim_after_rotation_then_a_different_continuation_matches_a_cold_run(loaded):
    ours, _, _ = loaded
    cache = small_caches(ours, slack=24, step=8)
    chunked_prefill(ours, PROMPT, CHUNKS, cache)
    assert all(layer.start > 0 for layer in cache if isinstance(layer, RotatingKVCache))
    assert all(layer.trim(20) == 20 for layer in cache)
    other = mx.array(np.random.default_rng(8).integers(0, 512, 12), mx.int32)
    resumed = ours(other[None], cache)
    cold = ours(mx.concatenate([PROMPT[:180], other])[None])
    assert last_logits_difference(resumed, cold) <= TOLERANCE


def test_a_snapshot_restores_every_layer(loaded):
    ours, _, _ = loaded
    cache = ours.make_cache()
    ours(PROMPT[None, :120], cache)
    snapshot = [layer.state for layer in cache]
    ours(PROMPT[None, 120:170], cache)
    for layer, state in zip(cache, snapshot, strict=True):
        layer.state = state
    resumed = ours(PROMPT[None, 120:200], cache)
    assert last_logits_difference(resumed, ours(PROMPT[None])) <= TOLERANCE


def rewrite_config(source: Path, target: Path, change) -> Path:
    target = Path(shutil.copytree(source, target))
    config = json.loads((target / "config.json").read_text())
    change(config)
    (target / "config.json").write_text(json.dumps(config))
    return target


def to_transformers_5(config: dict) -> None:
    pattern = config.pop("sliding_window_pattern")
    config["layer_types"] = [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(config["num_hidden_layers"])
    ]
    config["rope_parameters"] = {
        "full_attention": {"rope_theta": config.pop("rope_theta"), **config.pop("rope_scaling")},
        "sliding_attention": {"rope_type": "default", "rope_theta": config.pop("rope_local_base_freq")},
    }


def test_gemma3_transformers_5_config_reads_like_the_older_one(tmp_path):
    older = write_checkpoint(tmp_path / "older", "gemma3_text", seed=4)
    newer = rewrite_config(older, tmp_path / "newer", to_transformers_5)
    reference, _ = load_reference(older)  # mlx-lm 0.32 reads only the older vintage
    assert last_logits_difference(load_model(newer, gemma3_text)(PROMPT[None]), reference(PROMPT[None])) <= TOLERANCE


def to_pattern(config: dict) -> None:
    """gemma4_text as a sliding_window_pattern and default rotary settings (both as the tiny config's)."""
    del config["layer_types"], config["rope_parameters"]
    config["sliding_window_pattern"] = 3


def test_gemma4_sliding_window_pattern_reads_like_layer_types(tmp_path):
    listed = write_checkpoint(tmp_path / "listed", "gemma4_text", seed=4)
    patterned = rewrite_config(listed, tmp_path / "patterned", to_pattern)
    reference, _ = load_reference(listed)
    assert last_logits_difference(load_model(patterned, gemma4_text)(PROMPT[None]), reference(PROMPT[None])) <= TOLERANCE


VARIANTS = {
    "gemma3 untied": ("gemma3_text", {"tie_word_embeddings": False}),
    "gemma4 keys as values": ("gemma4_text", {"attention_k_eq_v": True}),
    "gemma4 untied, no sharing": ("gemma4_text", {"tie_word_embeddings": False, "num_kv_shared_layers": 0}),
    "gemma4 without per-layer inputs": ("gemma4_text", {"hidden_size_per_layer_input": 0, "use_double_wide_mlp": False}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variants_match_mlx_lm(variant, tmp_path):
    model_type, overrides = VARIANTS[variant]
    path = write_checkpoint(tmp_path, model_type, seed=5, overrides=overrides)
    ours, reference = load_model(path, MODULES[model_type]), load_reference(path)[0]
    assert last_logits_difference(ours(PROMPT[None]), reference(PROMPT[None])) <= TOLERANCE
    cache = ours.make_cache()
    assert last_logits_difference(chunked_prefill(ours, PROMPT, CHUNKS, cache), reference(PROMPT[None])) <= TOLERANCE


# mlx-lm's conversion of a gemma3 checkpoint drops the vision tower, so only the text model types.
@pytest.mark.parametrize("model_type", TEXT_MODULES)
def test_quantized_checkpoint_matches_mlx_lm(model_type, tmp_path):
    source = write_checkpoint(tmp_path / "float", model_type, seed=3)
    convert(str(source), str(tmp_path / "quantized"), quantize=True, q_group_size=32, q_bits=4)
    path = tmp_path / "quantized"
    ours, reference = load_model(path, MODULES[model_type]), load_reference(path)[0]
    assert isinstance(ours.model.layers[0].self_attn.q_proj, QuantizedLinear)
    assert last_logits_difference(ours(PROMPT[None]), reference(PROMPT[None])) <= TOLERANCE


def json_config(model_type: str) -> dict:
    return {**BASE_CONFIGS[model_type], "vocab_size": 512}


def test_refuses_what_it_does_not_implement():
    with pytest.raises(ValueError, match="soft-capping"):
        gemma3_text.ModelArgs.from_dict({**json_config("gemma3_text"), "attn_logit_softcapping": 50.0})
    with pytest.raises(ValueError, match="rope_type"):
        gemma3_text.ModelArgs.from_dict({**json_config("gemma3_text"), "rope_scaling": {"rope_type": "yarn"}})
