"""Tensor parallelism (plugd.nn.sharding) at the model level: two ranks of MLX's ring backend on loopback, started
by MLX's launcher, each load their share of a checkpoint; the logits they compute together, over a prompt
and then a decode step through the caches, are one process's. The HTTP tests (tests/test_distributed.py)
cover qwen3, qwen3_moe and qwen3_next; these cover Qwen3.5's own projections, Gemma 3 and 4 (norms after
each summed block, sliding-window caches, layers sharing earlier layers' keys and values, experts beside a
dense MLP), Nemotron-H (Mamba2 by heads and groups), a quantized checkpoint, and the refusals."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from plugd import plugins
from plugd.protocol import PIPELINE, TENSOR, stage_layers
from plugd.runner.loading import chosen_split
from plugd.runner.quantize import quantize_checkpoint
from plugd.scheduler.rank_share import RankShare, rank_share
from plugd.scheduler.runner_group import Hosts, free_ports
from plugd.settings import Settings
from plugd.testing.architectures import architecture_module
from plugd.testing.checkpoints import write_checkpoint

SCRIPT = """
import importlib, json, sys
import mlx.core as mx
from mlx.utils import tree_flatten
from plugd.runner.errors import CheckpointError
from plugd.runner.loading import load_model

PROMPTS = ([5, 9, 30, 44, 7, 100, 3, 8], [12, 6, 77, 2, 19])


def read_bytes():
    return int(next(line for line in open("/proc/self/io") if line.startswith("rchar")).split()[1])


def logits(model):
    # As the engine runs it: each prompt prefilled in two chunks whose caches alone are evaluated, its last token
    # decoded, then both decoded together as one batch; each forward pass evaluated before the next.
    caches, outputs = [], []
    for prompt in PROMPTS:
        cache = model.make_cache()
        for chunk in (prompt[:3], prompt[3:-1]):
            model(mx.array([chunk], mx.int32), cache=cache)
            mx.eval([layer.state for layer in cache])
        outputs.append(model(mx.array([prompt[-1:]], mx.int32), cache=cache))
        mx.eval(outputs[-1])
        caches.append(cache)
    batch = [layer.batch() for layer in caches[0]]
    for layer, *rows in zip(batch, *caches):
        layer.extend(rows, [64] * len(rows))
    outputs.append(model(mx.array([[11], [13]], mx.int32), cache=batch))
    mx.eval(outputs[-1])
    return outputs


group = mx.distributed.init(backend="ring", strict=True)
module = importlib.import_module(sys.argv[1])
report = {"rank": group.rank()}
try:
    results = []
    for split in (None, group):
        before = read_bytes()
        model = load_model(sys.argv[2], module, group=split, split=sys.argv[3] if len(sys.argv) > 3 else None)
        report["read" if split else "read_whole"] = read_bytes() - before
        report["held"] = sum(parameter.nbytes for _, parameter in tree_flatten(model.parameters()))
        results.append(logits(model))
    report["difference"] = max(mx.abs(a - b).max().item() for a, b in zip(*results))
except CheckpointError as refused:
    report["refused"] = str(refused)
print("report", json.dumps(report), flush=True)
"""


def run_ranks(tmp_path: Path, checkpoint: Path, split: str | None = None) -> list[dict]:
    """What each of two ranks reports loading `checkpoint` whole and split (as `split` says, or as the model
    declares): the largest difference of their logits, the bytes read from files for each load, or the refusal."""
    model_type = json.loads((checkpoint / "config.json").read_text())["model_type"]
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    launcher = shutil.which("mlx.launch", path=str(Path(sys.executable).parent))
    command = [launcher, "--backend", "ring", "-n", "2", "--starting-port", str(free_ports(2)), "--python",
               sys.executable, str(script), architecture_module(model_type).__name__, str(checkpoint),
               *([split] if split else [])]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as ranks:
        try:
            stdout, stderr = ranks.communicate(timeout=300)
        except subprocess.TimeoutExpired:  # ranks that wait for each other for ever: the launcher's and theirs
            os.killpg(ranks.pid, signal.SIGKILL)
            stdout, stderr = ranks.communicate()
    reports = [json.loads(line.split(maxsplit=1)[1]) for line in stdout.splitlines() if line.startswith("report ")]
    assert sorted(report["rank"] for report in reports) == [0, 1], stdout + stderr
    return sorted(reports, key=lambda report: report["rank"])


def differences(reports: list[dict]) -> list[float]:
    assert all("difference" in report for report in reports), reports
    return [report["difference"] for report in reports]


def checkpoint_tensors(checkpoint: Path) -> dict[str, dict]:
    """Each tensor's dtype, shape and place in its file, by name, as the safetensors headers give them."""
    tensors = {}
    for file in checkpoint.glob("*.safetensors"):
        with file.open("rb") as f:
            tensors |= json.loads(f.read(int.from_bytes(f.read(8), "little")))
    tensors.pop("__metadata__", None)
    return tensors


def assert_counted(reports: list[dict], checkpoint: Path, split: str) -> None:
    """The daemon's memory fit counts at least what rank 0 holds of the weights, and little more (a
    multi-token-prediction head, which a group leaves unread, not at all)."""
    config = json.loads((checkpoint / "config.json").read_text())
    dropped = plugins.load().architectures()[config["model_type"]].drafter_tensors
    counted = rank_share(checkpoint_tensors(checkpoint), 4, 2, split, dropped).weights  # float32: the CPU's dtype
    assert reports[0]["held"] <= counted <= 1.06 * reports[0]["held"]


@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_5_moe", "gemma3_text", "gemma3", "gemma4_text", "gemma4_text_moe",
                                  "nemotron_h"])
def test_a_model_splits_across_two_ranks(tmp_path, kind):
    # Its full-attention layers' one key-and-value head would not split; two do.
    overrides = {"num_global_key_value_heads": 2} if kind == "gemma4_text_moe" else None
    checkpoint = write_checkpoint(tmp_path / kind, kind, seed=2, overrides=overrides)
    reports = run_ranks(tmp_path, checkpoint)
    assert max(differences(reports)) < 1e-4
    assert_counted(reports, checkpoint, TENSOR)


def test_a_quantized_checkpoint_splits_across_two_ranks(tmp_path):
    quantized = tmp_path / "q4"
    quantize_checkpoint(write_checkpoint(tmp_path / "qwen3", "qwen3", seed=2), quantized,
                        architecture_module("qwen3"), bits=4, group_size=32)
    reports = run_ranks(tmp_path, quantized)
    assert max(differences(reports)) < 1e-4
    assert_counted(reports, quantized, TENSOR)


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "gemma3_text", "nemotron_h"])
def test_a_model_splits_into_a_pipeline_over_two_ranks(tmp_path, kind):
    checkpoint = write_checkpoint(tmp_path / kind, kind, seed=2)
    reports = run_ranks(tmp_path, checkpoint, PIPELINE)
    assert max(differences(reports)) < 1e-5
    assert_counted(reports, checkpoint, PIPELINE)
    layers: dict[int, int] = {}  # the bytes of each layer's tensors in the files
    for name, tensor in checkpoint_tensors(checkpoint).items():
        if match := re.search(r"layers\.(\d+)\.", name):
            layers[int(match[1])] = layers.get(int(match[1]), 0) + tensor["data_offsets"][1] - tensor["data_offsets"][0]
    for report in reports:
        others = sum(size for layer, size in layers.items() if layer not in stage_layers(len(layers), 2, report["rank"]))
        # Less than a layer's bytes of noise: reading /proc itself counts.
        assert report["read"] <= report["read_whole"] - others + 4096, "a rank read another rank's layers"


def test_gemma4_refuses_a_pipeline_with_the_reason(tmp_path):
    checkpoint = write_checkpoint(tmp_path / "gemma4_text", "gemma4_text", seed=2)
    for report in run_ranks(tmp_path, checkpoint, PIPELINE):
        assert "share keys and values across the model" in report["refused"]
        assert f"PLUGD_GROUP_SPLIT={TENSOR}" in report["refused"]


def test_a_group_splits_by_tensors_where_the_architecture_says_how_and_by_layers_otherwise():
    declares, silent = SimpleNamespace(shard=lambda group: None), SimpleNamespace()
    assert (chosen_split(declares, None), chosen_split(silent, None)) == (TENSOR, PIPELINE)
    assert (chosen_split(declares, PIPELINE), chosen_split(silent, TENSOR)) == (PIPELINE, TENSOR)


def test_the_memory_fit_counts_the_larger_share_where_the_architecture_decides_the_split():
    """Three layers over two ranks: rank 0's stage is two of them, more than half of every matrix; a vision
    tower's deeper stack of smaller layers is not taken for the decoder's, and stays whole like the embeddings."""
    def f32(*shape: int) -> dict:
        return {"dtype": "F32", "shape": list(shape)}

    tensors = {"model.embed_tokens.weight": f32(100, 8), "lm_head.weight": f32(100, 8)}
    tensors |= {f"vision_tower.encoder.layers.{i}.fc.weight": f32(4, 4) for i in range(6)}
    for i in range(3):
        tensors |= {f"model.layers.{i}.mlp.up_proj.weight": f32(16, 8), f"model.layers.{i}.norm.weight": f32(8),
                    f"model.layers.{i}.mlp.gate.weight": f32(4, 8)}  # a router: whole on every rank
    whole = 4 * (2 * 800 + 6 * 16)
    by_layers, by_tensors = whole + 4 * 2 * (128 + 8 + 32), whole + 4 * 3 * (64 + 8 + 32)
    assert rank_share(tensors, 4, 2, PIPELINE) == RankShare(by_layers, 2 / 3)
    assert rank_share(tensors, 4, 2, TENSOR) == RankShare(by_tensors, 1 / 2)
    assert rank_share(tensors, 4, 2, None) == RankShare(max(by_layers, by_tensors), 2 / 3)


def test_heads_that_do_not_divide_are_refused(tmp_path):
    checkpoint = write_checkpoint(tmp_path / "odd", "qwen3", overrides={"num_key_value_heads": 1})
    for report in run_ranks(tmp_path, checkpoint):
        assert "cannot split its tensors across 2 ranks: 1 key/value heads do not split evenly" in report["refused"]


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


def test_a_host_file_in_any_of_mlx_forms_reads(tmp_path):
    hosts = [{"ssh": "127.0.0.1", "ips": ["10.0.0.1"]}, {"ssh": "mac2", "ips": ["10.0.0.2"]}]
    for content in (hosts, {"backend": "ring", "hosts": hosts}, {"backend": "", "envs": [], "hosts": hosts}):
        (tmp_path / "hosts.json").write_text(json.dumps(content))
        assert Hosts.read(tmp_path / "hosts.json").names == ("127.0.0.1", "mac2")
