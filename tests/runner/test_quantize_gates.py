"""plugd.runner.quantize keeps MoE routing at 8 bits as mlx-lm's convert does: Qwen3-Next's and Qwen3.5-MoE's router
(`mlp.gate`) and shared-expert gate (`mlp.shared_expert_gate`), Gemma 4's router (`router.proj`). A 4-bit checkpoint
quantized by plugd decodes, in plugd, the greedy tokens mlx-lm decodes from its own quantization of the same
weights."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import convert

from plugd.runner.loading import load_model
from plugd.runner.quantize import quantize_checkpoint
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.parity import greedy_tokens, mlx_lm_greedy_tokens
from plugd_gemma import gemma4_text
from plugd_qwen import qwen3_5_moe, qwen3_next

PROMPT = mx.array(np.random.default_rng(5).integers(0, 512, 24), mx.int32)
DECODE_TOKENS = 16
EIGHT_BITS = {"group_size": 64, "bits": 8}
# checkpoint kind -> (architecture module, the gates kept at 8 bits in layer 0, relative to the layer)
CASES = {
    "qwen3_next": (qwen3_next, ("mlp.gate", "mlp.shared_expert_gate")),
    "qwen3_5_moe": (qwen3_5_moe, ("mlp.gate", "mlp.shared_expert_gate")),
    "gemma4_text_moe": (gemma4_text, ("router.proj",)),
}


def quantization(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())["quantization"]


def layer_zero(entries: dict, suffix: str) -> dict | bool | None:
    """The entry of layer 0's `suffix`, wherever the model nests its layers (not the multi-token-prediction head's,
    which mlx-lm's conversion drops)."""
    found = [value for key, value in entries.items() if key.endswith(f"layers.0.{suffix}") and "mtp." not in key]
    assert len(found) <= 1, found
    return found[0] if found else None


@pytest.mark.parametrize("kind", sorted(CASES))
def test_gates_stay_at_8_bits_and_greedy_tokens_match_mlx_lm_quantization(kind, tmp_path):
    module, gates = CASES[kind]
    source = write_checkpoint(tmp_path / "float", kind, seed=3)
    quantize_checkpoint(source, tmp_path / "ours", module, 4)
    convert(str(source), str(tmp_path / "mlx_lm"), quantize=True, q_group_size=64, q_bits=4)
    ours, theirs = quantization(tmp_path / "ours"), quantization(tmp_path / "mlx_lm")
    for gate in gates:
        assert layer_zero(ours, gate) == layer_zero(theirs, gate) == EIGHT_BITS, gate
    model = load_model(tmp_path / "ours", module)
    expected = mlx_lm_greedy_tokens(tmp_path / "mlx_lm", PROMPT, DECODE_TOKENS)
    assert greedy_tokens(model, PROMPT, DECODE_TOKENS) == expected
