"""Tensor parallelism (plugd.nn.sharding) at the model level: two ranks of MLX's ring backend on loopback, started
by MLX's launcher, each load their share of a checkpoint; the logits they compute together, over a prompt
and then a decode step through the caches, are one process's. The HTTP tests (tests/test_distributed.py)
cover qwen3, qwen3_moe and qwen3_next; these cover Qwen3.5's own projections, Gemma 3 and 4 (norms after
each summed block, sliding-window caches, layers sharing earlier layers' keys and values, experts beside a
dense MLP), Nemotron-H (Mamba2 by heads and groups), a quantized checkpoint, and the refusals."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from plugd.runner.quantize import quantize_checkpoint
from plugd.scheduler.runner_group import Hosts, free_ports
from plugd.settings import Settings
from plugd.testing.architectures import architecture_module
from plugd.testing.checkpoints import write_checkpoint

SCRIPT = """
import importlib, sys
import mlx.core as mx
from plugd.runner.errors import CheckpointError
from plugd.runner.loading import load_model

group = mx.distributed.init(backend="ring", strict=True)
module = importlib.import_module(sys.argv[1])
outputs = []
try:
    for split in (None, group):
        model = load_model(sys.argv[2], module, group=split)
        cache = model.make_cache()
        prompt = model(mx.array([[5, 9, 30, 44, 7, 100, 3, 8]], mx.int32), cache=cache)
        step = model(mx.array([[11]], mx.int32), cache=cache)
        mx.eval(prompt, step)
        outputs.append((prompt, step))
except CheckpointError as refused:
    print(f"rank {group.rank()} refused: {refused}", flush=True)
    sys.exit(0)
difference = max(mx.abs(a - b).max().item() for a, b in zip(*outputs))
print(f"rank {group.rank()} difference {difference:.3g}", flush=True)
"""


def run_ranks(tmp_path: Path, checkpoint: Path) -> str:
    """What two ranks print loading `checkpoint` split and whole, and comparing the two."""
    model_type = json.loads((checkpoint / "config.json").read_text())["model_type"]
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    launcher = shutil.which("mlx.launch", path=str(Path(sys.executable).parent))
    result = subprocess.run([launcher, "--backend", "ring", "-n", "2", "--starting-port", str(free_ports(2)),
                             "--python", sys.executable, str(script), architecture_module(model_type).__name__,
                             str(checkpoint)],
                            capture_output=True, text=True, timeout=300)
    return result.stdout + result.stderr


def differences(output: str) -> list[float]:
    return [float(line.split()[-1]) for line in output.splitlines() if " difference " in line]


@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_5_moe", "gemma3_text", "gemma3", "gemma4_text", "gemma4_text_moe",
                                  "nemotron_h"])
def test_a_model_splits_across_two_ranks(tmp_path, kind):
    # Its full-attention layers' one key-and-value head would not split; two do.
    overrides = {"num_global_key_value_heads": 2} if kind == "gemma4_text_moe" else None
    checkpoint = write_checkpoint(tmp_path / kind, kind, seed=2, overrides=overrides)
    output = run_ranks(tmp_path, checkpoint)
    assert len(differences(output)) == 2, output
    assert max(differences(output)) < 1e-4, output


def test_a_quantized_checkpoint_splits_across_two_ranks(tmp_path):
    quantized = tmp_path / "q4"
    quantize_checkpoint(write_checkpoint(tmp_path / "qwen3", "qwen3", seed=2), quantized,
                        architecture_module("qwen3"), bits=4, group_size=32)
    output = run_ranks(tmp_path, quantized)
    assert len(differences(output)) == 2, output
    assert max(differences(output)) < 1e-4, output


def test_heads_that_do_not_divide_are_refused(tmp_path):
    checkpoint = write_checkpoint(tmp_path / "odd", "qwen3", overrides={"num_key_value_heads": 1})
    output = run_ranks(tmp_path, checkpoint)
    assert "refused: cannot split across 2 ranks: 1 key/value heads do not split evenly" in output, output


@pytest.mark.parametrize("content, problem", [
    ([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}], "two or more hosts"),
    ([{"ssh": "a"}, {"ssh": "b", "ips": ["10.0.0.2"]}], "rank 0 needs"),
    ({"backend": "jaccl", "hosts": []}, "ring backend only"),
    ("not json", "cannot read"),
])
def test_a_host_file_plugd_cannot_use_is_refused(tmp_path, content, problem):
    path = tmp_path / "hosts.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ValueError, match=problem):
        Hosts.read(path)


def test_the_daemon_names_the_variable_of_a_bad_host_file(tmp_path):
    with pytest.raises(ValueError, match="invalid PLUGD_HOSTFILE: cannot read the host file"):
        Settings.from_environment({"PLUGD_HOSTFILE": str(tmp_path / "missing.json")})


def test_a_host_file_in_either_of_mlx_forms_reads(tmp_path):
    hosts = [{"ssh": "127.0.0.1", "ips": ["10.0.0.1"]}, {"ssh": "mac2", "ips": ["10.0.0.2"]}]
    for content in (hosts, {"backend": "ring", "hosts": hosts}):
        (tmp_path / "hosts.json").write_text(json.dumps(content))
        assert Hosts.read(tmp_path / "hosts.json").names == ("127.0.0.1", "mac2")
