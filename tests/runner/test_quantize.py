"""plugd.runner.quantize on tiny qwen3 / qwen3_moe checkpoints: what it writes, who can load it, how it fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import convert

from plugd.runner import quantize
from plugd.runner.loading import CheckpointError, load_model
from plugd.runner.quantize import quantize_checkpoint
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.parity import greedy_tokens, mlx_lm_greedy_tokens
from plugd_qwen import qwen3, qwen3_moe

MODULES = {"qwen3": qwen3, "qwen3_moe": qwen3_moe}
PROMPT = mx.array(np.random.default_rng(5).integers(0, 512, 24), mx.int32)
DECODE_TOKENS = 16






def disk_size(path: Path) -> int:
    return sum(file.stat().st_size for file in path.glob("*.safetensors"))


def tensors(path: Path) -> dict[str, mx.array]:
    return {name: tensor for file in path.glob("*.safetensors") for name, tensor in mx.load(str(file)).items()}


def assert_same_tensors(ours: Path, reference: Path) -> None:
    a, b = tensors(ours), tensors(reference)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and mx.array_equal(a[name], b[name]).item(), name


def siblings(path: Path) -> list[str]:
    return sorted(entry.name for entry in path.parent.iterdir())


CASES = [(model_type, bits) for model_type in sorted(MODULES) for bits in (4, 8)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{model_type}-{bits}bit" for model_type, bits in CASES])
def quantized(request, tmp_path_factory) -> tuple[str, int, Path, Path]:
    model_type, bits = request.param
    root = tmp_path_factory.mktemp(f"{model_type}-{bits}bit")
    source = write_checkpoint(root / "float", model_type, seed=3)
    quantize_checkpoint(source, root / "quantized", MODULES[model_type], bits)
    return model_type, bits, source, root / "quantized"


def test_plugd_and_mlx_lm_load_it_and_decode_the_same_tokens(quantized):
    model_type, _, _, path = quantized
    assert greedy_tokens(load_model(path, MODULES[model_type]), PROMPT, DECODE_TOKENS) == mlx_lm_greedy_tokens(
        path, PROMPT, DECODE_TOKENS)


def test_config_records_the_quantization_as_mlx_lm_does(quantized):
    model_type, bits, source, path = quantized
    config = json.loads((path / "config.json").read_text())
    expected = {"group_size": 64, "bits": bits, "mode": "affine"}
    if model_type == "qwen3_moe":
        for layer in range(config["num_hidden_layers"]):
            # 32 expert inputs do not fill a group of 64, so the down projection stays dense.
            expected[f"model.layers.{layer}.mlp.switch_mlp.down_proj"] = False
            if bits != 8:
                expected[f"model.layers.{layer}.mlp.gate"] = {"group_size": 64, "bits": 8}
    assert config["quantization"] == config["quantization_config"] == expected
    original = json.loads((source / "config.json").read_text())
    assert {key: value for key, value in config.items() if not key.startswith("quantization")} == original


def test_weights_are_smaller_and_the_other_files_copied(quantized):
    _, _, source, path = quantized
    assert disk_size(path) < disk_size(source)
    assert sorted(file.name for file in path.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (path / name).read_bytes() == (source / name).read_bytes()


@pytest.mark.parametrize(
    ("model_type", "options"),
    [
        ("qwen3", {}),
        ("qwen3", {"overrides": {"tie_word_embeddings": True}}),
        ("qwen3_moe", {"dtype": "bfloat16", "shards": 2}),
    ],
)
def test_tensors_are_those_mlx_lm_convert_writes(model_type, options, tmp_path):
    source = write_checkpoint(tmp_path / "float", model_type, seed=4, **options)
    quantize_checkpoint(source, tmp_path / "ours", MODULES[model_type], 4)
    convert(str(source), str(tmp_path / "mlx_lm"), quantize=True, q_group_size=64, q_bits=4)
    assert_same_tensors(tmp_path / "ours", tmp_path / "mlx_lm")


def test_large_checkpoints_are_sharded_with_an_index(tmp_path, monkeypatch):
    source = write_checkpoint(tmp_path / "float", "qwen3_moe", seed=3)
    quantize_checkpoint(source, tmp_path / "whole", qwen3_moe, 4)
    monkeypatch.setattr(quantize, "MAX_SHARD_BYTES", 40_000)
    (tmp_path / "sharded").mkdir()  # an empty destination is taken over
    quantize_checkpoint(source, tmp_path / "sharded", qwen3_moe, 4)
    files = sorted(file.name for file in (tmp_path / "sharded").glob("*.safetensors"))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == files
    assert index["weight_map"].keys() == tensors(tmp_path / "whole").keys()
    assert_same_tensors(tmp_path / "sharded", tmp_path / "whole")
    tokens = greedy_tokens(load_model(tmp_path / "sharded", qwen3_moe), PROMPT, DECODE_TOKENS)
    assert tokens == mlx_lm_greedy_tokens(tmp_path / "sharded", PROMPT, DECODE_TOKENS)


@pytest.mark.parametrize(("bits", "group_size", "message"), [(7, 64, "7 bits"), (4, 48, "groups of 48")])
def test_unsupported_bits_or_group_size_write_nothing(bits, group_size, message, tmp_path):
    source = write_checkpoint(tmp_path / "float", "qwen3", seed=3)
    with pytest.raises(ValueError, match=message):
        quantize_checkpoint(source, tmp_path / "out", qwen3, bits, group_size)
    assert siblings(tmp_path / "out") == ["float"]


def test_a_non_empty_destination_is_left_alone(tmp_path):
    source = write_checkpoint(tmp_path / "float", "qwen3", seed=3)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an empty directory"):
        quantize_checkpoint(source, tmp_path / "out", qwen3, 4)
    assert [file.name for file in (tmp_path / "out").iterdir()] == ["keep.txt"]
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    assert siblings(tmp_path / "out") == ["float", "out"]


def test_a_failure_midway_leaves_no_partial_output(tmp_path, monkeypatch):
    source = write_checkpoint(tmp_path / "float", "qwen3", seed=3)
    (tmp_path / "out").mkdir()

    def disk_full(*_):
        raise OSError("No space left on device")

    # Copying the tokenizer comes after the weights and config.json are written.
    monkeypatch.setattr(quantize.shutil, "copy2", disk_full)
    with pytest.raises(OSError, match="No space left"):
        quantize_checkpoint(source, tmp_path / "out", qwen3, 4)
    assert list((tmp_path / "out").iterdir()) == []
    assert siblings(tmp_path / "out") == ["float", "out"]


def test_a_checkpoint_that_does_not_fit_its_config_is_refused(tmp_path):
    source = write_checkpoint(tmp_path / "float", "qwen3", seed=3)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(CheckpointError, match="missing tensor model.layers.2"):
        quantize_checkpoint(source, tmp_path / "out", qwen3, 4)
    assert siblings(tmp_path / "out") == ["float"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "plugd.runner.quantize", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_command_line(tmp_path):
    source = write_checkpoint(tmp_path / "float", "qwen3", seed=3)
    done = run_cli(str(source), str(tmp_path / "out"), "--module", "plugd_qwen.qwen3", "--bits", "8")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "out" / "config.json").read_text())["quantization"]["bits"] == 8
    load_model(tmp_path / "out", qwen3)

    again = run_cli(str(source), str(tmp_path / "out"), "--module", "plugd_qwen.qwen3", "--bits", "4")
    assert again.returncode == 1
    assert again.stderr.count("\n") == 1 and "not an empty directory" in again.stderr

    bad = run_cli(str(source), str(tmp_path / "other"), "--module", "plugd_qwen.nope", "--bits", "4")
    assert bad.returncode == 1
    assert bad.stderr.count("\n") == 1 and "plugd_qwen.nope" in bad.stderr
    assert not (tmp_path / "other").exists()
