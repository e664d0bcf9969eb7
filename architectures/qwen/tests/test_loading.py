"""Loading: every tensor is read, folded and cast in one evaluation; malformed checkpoints fail with a
CheckpointError that names the offending tensor."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from plugd.runner.loading import CheckpointError, load_model
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.parity import counted_evaluations
from plugd_qwen import qwen3, qwen3_moe


def test_moe_checkpoint_loads_with_a_single_evaluation(tmp_path):
    path = write_checkpoint(tmp_path, "qwen3_moe", shards=2)
    model, evaluations = counted_evaluations(lambda: load_model(path, qwen3_moe))
    assert evaluations == [1]
    assert model.model.layers[1].mlp.switch_mlp.gate_proj.weight.shape == (4, 32, 64)


def rewritten(path: Path, change: Callable[[dict[str, np.ndarray]], None]) -> Path:
    """`path`'s single-file checkpoint with its tensors passed through `change`."""
    file = path / "model.safetensors"
    tensors = load_file(file)
    change(tensors)
    save_file(tensors, file)
    return path


def test_missing_tensor_is_named(tmp_path):
    name = "model.layers.1.self_attn.k_proj.weight"
    path = rewritten(write_checkpoint(tmp_path, "qwen3"), lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=re.escape(f"missing tensor {name}")):
        load_model(path, qwen3)


def test_missing_expert_tensor_is_named(tmp_path):
    name = "model.layers.0.mlp.experts.3.down_proj.weight"
    path = rewritten(write_checkpoint(tmp_path, "qwen3_moe"), lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=re.escape(f"missing tensor {name}")):
        load_model(path, qwen3_moe)


def test_wrong_shape_is_named_with_both_shapes(tmp_path):
    name = "model.layers.0.mlp.up_proj.weight"

    def truncate(tensors):
        tensors[name] = tensors[name][:, :60].copy()

    path = rewritten(write_checkpoint(tmp_path, "qwen3"), truncate)
    expected = f"tensor {name} has shape (128, 60), the model expects (128, 64)"
    with pytest.raises(CheckpointError, match=re.escape(expected)):
        load_model(path, qwen3)


def test_unexpected_tensor_is_named(tmp_path):
    def add(tensors):
        tensors["model.layers.0.self_attn.extra.weight"] = np.zeros((4,), np.float32)

    path = rewritten(write_checkpoint(tmp_path, "qwen3"), add)
    with pytest.raises(CheckpointError, match=re.escape("unexpected tensor model.layers.0.self_attn.extra.weight")):
        load_model(path, qwen3)


def test_directory_without_safetensors_is_refused(tmp_path):
    path = write_checkpoint(tmp_path, "qwen3")
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no \\*.safetensors files"):
        load_model(path, qwen3)
