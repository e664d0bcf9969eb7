"""Gemma 4's mixture-of-experts layers (enable_moe_block, the 26B-A4B's shape) against mlx-lm's gemma4_text on a tiny
checkpoint with transformers 5's fused expert tensors: logits after a 200-token prompt (whole, and in chunks through
the rotating caches), greedy decoding, a 4-bit checkpoint converted by mlx-lm (router at 8 bits), and the same
weights in the hub's layout (model_type gemma4, a vision config but no tower) against mlx-lm's gemma4."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import convert
from mlx_lm.utils import load_model as load_reference

from plugd.nn.linear import QuantizedLinear
from plugd.nn.switch import QuantizedSwitchLinear
from plugd.runner.loading import load_model
from plugd.testing.checkpoints import BASE_CONFIGS, write_checkpoint
from plugd.testing.parity import chunked_prefill, greedy_tokens, last_logits_difference, mlx_lm_greedy_tokens
from plugd_gemma import gemma4, gemma4_text

TOLERANCE = 1e-4
PROMPT = mx.array(np.random.default_rng(7).integers(0, 512, 200), mx.int32)
CHUNKS = ((0, 45), (45, 90), (90, 91), (91, 160), (160, 199), (199, 200))
DECODE_TOKENS = 32


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("gemma4-moe"), "gemma4_text_moe", seed=1)


@pytest.fixture(scope="module")
def loaded(checkpoint):
    ours = load_model(checkpoint, gemma4_text)
    return ours, load_reference(checkpoint)[0](PROMPT[None])


def test_fused_experts_load_as_stacked_projections(loaded):
    ours, _ = loaded
    config = BASE_CONFIGS["gemma4_text_moe"]
    experts, hidden, dims = config["num_experts"], config["moe_intermediate_size"], config["hidden_size"]
    for layer in ours.model.layers:
        glu = layer.experts.switch_glu
        assert glu.gate_proj.weight.shape == glu.up_proj.weight.shape == (experts, hidden, dims)
        assert glu.down_proj.weight.shape == (experts, dims, hidden)
        assert not mx.array_equal(glu.gate_proj.weight, glu.up_proj.weight).item()


def test_prompt_logits_match_mlx_lm_whole_and_in_chunks(loaded):
    ours, expected = loaded
    assert last_logits_difference(ours(PROMPT[None]), expected) <= TOLERANCE
    assert last_logits_difference(chunked_prefill(ours, PROMPT, CHUNKS), expected) <= TOLERANCE


def test_cached_greedy_decode_matches_mlx_lm_generate(checkpoint, loaded):
    ours, _ = loaded
    assert greedy_tokens(ours, PROMPT, DECODE_TOKENS) == mlx_lm_greedy_tokens(checkpoint, PROMPT, DECODE_TOKENS)


def test_the_experts_count(checkpoint, loaded):
    """Without the experts' share (their post-norm zeroed) the logits move: the parity above covers the MoE path."""
    _, expected = loaded
    model = load_model(checkpoint, gemma4_text)
    for layer in model.model.layers:
        layer.post_feedforward_layernorm_2.weight = mx.zeros_like(layer.post_feedforward_layernorm_2.weight)
    assert last_logits_difference(model(PROMPT[None]), expected) > 100 * TOLERANCE


def test_mlx_lm_quantized_checkpoint_matches_mlx_lm(checkpoint, tmp_path):
    convert(str(checkpoint), str(tmp_path / "quantized"), quantize=True, q_group_size=32, q_bits=4)
    path = tmp_path / "quantized"
    ours, reference = load_model(path, gemma4_text), load_reference(path)[0]
    layer = ours.model.layers[0]
    assert isinstance(layer.experts.switch_glu.down_proj, QuantizedSwitchLinear)
    assert isinstance(layer.router.proj, QuantizedLinear) and layer.router.proj.bits == 8
    assert last_logits_difference(ours(PROMPT[None]), reference(PROMPT[None])) <= TOLERANCE
    assert greedy_tokens(ours, PROMPT, DECODE_TOKENS) == mlx_lm_greedy_tokens(path, PROMPT, DECODE_TOKENS)


def test_an_incomplete_moe_config_is_refused_by_name():
    config = {**BASE_CONFIGS["gemma4_text_moe"], "vocab_size": 512}
    del config["top_k_experts"]
    with pytest.raises(ValueError, match="top_k_experts"):
        gemma4_text.ModelArgs.from_dict(config)


def as_hub_layout(source: Path, target: Path) -> Path:
    """The checkpoint as Gemma4ForConditionalGeneration holds it: text settings in text_config (a vision_config
    beside them), the decoder's tensors under model.language_model., no vision tower (so it runs text only) and an
    audio tower (one tensor of it) that is dropped."""
    target.mkdir()
    text = json.loads((source / "config.json").read_text())
    config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
              "vocab_size": text["vocab_size"], "eos_token_id": text["eos_token_id"], "text_config": text,
              "vision_config": {"model_type": "gemma4_vision"}}
    (target / "config.json").write_text(json.dumps(config))
    tensors = {"model.language_model." + name.removeprefix("model."): tensor
               for name, tensor in mx.load(str(source / "model.safetensors")).items()}
    tensors["model.audio_tower.subsample_conv_projection.weight"] = mx.zeros((4, 4))
    mx.save_safetensors(str(target / "model.safetensors"), tensors, metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (target / name).write_bytes((source / name).read_bytes())
    return target


def test_the_hub_layout_loads_as_mlx_lm_gemma4_loads_it_also_quantized(checkpoint, loaded, tmp_path):
    _, expected = loaded
    path = as_hub_layout(checkpoint, tmp_path / "hub")
    ours, reference = load_model(path, gemma4), load_reference(path)[0]
    assert last_logits_difference(ours(PROMPT[None]), expected) <= TOLERANCE
    assert last_logits_difference(reference(PROMPT[None]), expected) <= TOLERANCE
    convert(str(path), str(tmp_path / "quantized"), quantize=True, q_group_size=32, q_bits=4)
    ours, reference = load_model(tmp_path / "quantized", gemma4), load_reference(tmp_path / "quantized")[0]
    assert ours.language_model.model.layers[0].router.proj.bits == 8
    assert last_logits_difference(ours(PROMPT[None]), reference(PROMPT[None])) <= TOLERANCE
