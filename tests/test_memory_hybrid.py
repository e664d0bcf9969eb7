"""The scheduler's memory estimate for hybrid models against what a real runner allocates.

A `plugd runner` process loads a tiny Nemotron-H (Mamba2 + attention) or Qwen3.5 (Gated DeltaNet + attention)
checkpoint and fills its context; the MLX memory it reports in use grows by its caches (the built-in cache
policy's snapshots included: the prefix-cache plugin keeps restore points under a byte budget of its own,
which the estimate leaves out). The estimate must cover that growth (an upper bound, also with the weights)
without counting recurrent layers as attention layers: within ESTIMATE_FACTOR of it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from plugd import plugins
from plugd.hookspecs import LayerCache
from plugd.protocol import RunnerConfig
from plugd.scheduler import memory
from plugd.testing.checkpoints import BASE_CONFIGS, write_checkpoint

NUM_CTX = 1024
PROMPT_TOKENS = 1000
ESTIMATE_FACTOR = 1.5
MODULES = {"nemotron_h": "plugd_nemotron.nemotron_h", "qwen3_5": "plugd_qwen.qwen3_5"}


def header_tensors(model_dir: Path) -> dict[str, dict]:
    """Each tensor's dtype and shape from the safetensors headers, as the store's metadata gives them."""
    tensors = {}
    for file in model_dir.glob("*.safetensors"):
        with file.open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        header.pop("__metadata__", None)
        tensors |= header
    return tensors


class Runner:
    """A `plugd runner` child on a Unix socket, as the daemon starts one."""

    def __init__(self, model_dir: Path, module: str, workdir: Path):
        socket, self.log = workdir / "runner.sock", workdir / "runner.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "plugd", "runner", "--model-dir", str(model_dir), "--socket", str(socket),
                 "--config", RunnerConfig(module, "plugd.runner.cache_policy:single_slot").to_json()],
                stdout=subprocess.DEVNULL, stderr=log,
            )
        self.http = httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), base_url="http://runner", timeout=120)
        for _ in range(600):
            try:
                self.http.get("/status").raise_for_status()
                return
            except httpx.TransportError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"runner exited: {self.log.read_text()}") from None
                time.sleep(0.1)
        raise TimeoutError("runner did not start")

    def active_memory(self) -> int:
        return self.http.get("/status").json()["memory"]["mlx_active"]

    def fill_context(self, tokens: list[int]) -> dict:
        body = {"tokens": tokens, "num_predict": NUM_CTX - len(tokens), "num_ctx": NUM_CTX, "num_keep": 0, "stop": [],
                "sampling": {"temperature": 0.0, "repeat_penalty": 1.0}}
        with self.http.stream("POST", "/completion", json=body) as response:
            response.raise_for_status()
            lines = [json.loads(line) for line in response.iter_lines() if line]
        return lines[-1]

    def close(self) -> None:
        self.http.close()
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module", params=sorted(MODULES))
def measured(request, tmp_path_factory) -> tuple[dict, dict, int, int]:
    """(config, header tensors, MLX memory in use once loaded, and once the context is full)."""
    root = tmp_path_factory.mktemp(request.param)
    model_dir = write_checkpoint(root / "model", request.param, seed=2)
    runner = Runner(model_dir, MODULES[request.param], root)
    try:
        loaded = runner.active_memory()
        prompt = np.random.default_rng(3).integers(3, 500, PROMPT_TOKENS).tolist()
        done = runner.fill_context(prompt)
        assert done["type"] == "done" and done["prompt_tokens"] == PROMPT_TOKENS
        full = runner.active_memory()
    finally:
        runner.close()
    return json.loads((model_dir / "config.json").read_text()), header_tensors(model_dir), loaded, full


def estimate(config: dict) -> memory.CacheEstimate:
    """As the daemon estimates the caches, through the architecture's descriptor; float32 on CPU."""
    architecture = plugins.load().architectures()[config["model_type"]]
    return memory.CacheEstimate.of(architecture, config, float_bytes=4)


def test_the_estimate_bounds_the_caches_within_a_factor(measured):
    config, _, loaded, full = measured
    caches, estimated = full - loaded, estimate(config).bytes(NUM_CTX)
    assert caches <= estimated <= ESTIMATE_FACTOR * caches, (caches, estimated)


def test_weights_and_caches_together_bound_what_the_runner_holds(measured):
    config, tensors, _, full = measured
    assert full <= memory.weight_bytes(tensors, float_bytes=4) + estimate(config).bytes(NUM_CTX)


def kinds(model_type: str) -> list[str]:
    def kind(layer: LayerCache) -> str:
        if layer.state or layer.state_float32:
            return "recurrent"
        if not layer.per_position:
            return "stateless"
        return "full" if layer.window is None else "sliding"

    config = BASE_CONFIGS[model_type] | {"model_type": model_type}
    return [kind(layer) for layer in estimate(config).layers]


def test_what_each_layer_caches():
    """Nemotron-H's 'ME*M-M' has one attention layer among six; Qwen3.5's four layers alternate linear and full,
    and its multi-token-prediction head keeps something at every position too; Gemma 4's last two layers share
    earlier layers' keys and values."""
    assert kinds("nemotron_h") == ["recurrent", "stateless", "full", "recurrent", "stateless", "recurrent"]
    assert kinds("qwen3_5") == ["recurrent", "full", "recurrent", "full", "full"]
    assert kinds("gemma4_text") == ["sliding", "sliding", "full", "sliding", "stateless", "stateless"]
    assert kinds("gemma3_text") == ["sliding", "full"] * 2
