"""plugd.testing as plugin authors use it: temporary plugins, tiny checkpoints of any registered architecture,
servers with chosen plugins, and the parity check against a reference."""

from __future__ import annotations

import json
import sys

import mlx.core as mx
import pytest

from plugd import plugins
from plugd.runner.loading import load_model
from plugd.testing import checkpoints
from plugd.testing.architectures import tiny_checkpoint
from plugd.testing.plugins import TemporaryPlugins
from plugd.testing.reference import assert_parity
from plugd_qwen import qwen3

SHOUT = """
from plugd.hookspecs import Renderer, hookimpl
from plugd.types import Prompt

@hookimpl
def plugd_renderers():
    return [Renderer(name="shout", render=lambda request: Prompt(text=request.messages[-1].content.upper()))]
"""
# An architecture plugin that is its own model module: qwen3's model code under another model type.
KIT_QWEN = """
from plugd.hookspecs import Architecture, hookimpl
from plugd_qwen.qwen3 import Model, ModelArgs
from plugd.testing.checkpoints import BASE_CONFIGS

TINY_CONFIG = {**BASE_CONFIGS["qwen3"], "num_hidden_layers": 3}

@hookimpl
def plugd_architectures():
    return [Architecture(model_type="kit_qwen", module=__name__)]
"""
NO_TINY_CONFIG = """
from plugd.hookspecs import Architecture, hookimpl

@hookimpl
def plugd_architectures():
    return [Architecture(model_type="kit_bare", module=__name__)]
"""


def test_temporary_plugins_load_in_process_and_are_gone_afterwards(tmp_path):
    with TemporaryPlugins(tmp_path / "site") as temporary:
        temporary.add("shout", SHOUT)
        registry = plugins.load()
        assert {p.name: p.status for p in registry.plugins}["shout"] == "ok"
        assert "shout" in registry.renderers()
    assert "shout" not in {p.name for p in plugins.load().plugins}
    assert "plugd_temporary_shout" not in sys.modules


def safetensors_shapes(path) -> dict[str, tuple[int, ...]]:
    data = (path / "model.safetensors").read_bytes()
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    return {name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}


def test_tiny_checkpoint_of_a_plugin_architecture_has_its_models_tensors(plugd_temporary_plugins, tmp_path):
    plugd_temporary_plugins.add("kit-qwen", KIT_QWEN)
    path = tiny_checkpoint(tmp_path / "kit", "kit_qwen", seed=4)
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "kit_qwen" and config["num_hidden_layers"] == 3
    # Derived from the model's own parameters, the tensors are those the hand-written qwen3 table lists.
    assert safetensors_shapes(path) == checkpoints.SHAPES["qwen3"](config)
    model = load_model(path, qwen3)
    assert model(mx.array([[1, 2, 3]], mx.int32)).shape == (1, 3, config["vocab_size"])


def test_tiny_checkpoint_names_what_is_missing(plugd_temporary_plugins, tmp_path):
    with pytest.raises(LookupError, match=r"no loaded plugin registers model_type 'kit_nowhere'; registered: \[.*'qwen3'"):
        tiny_checkpoint(tmp_path / "a", "kit_nowhere")
    plugd_temporary_plugins.add("kit-bare", NO_TINY_CONFIG)
    with pytest.raises(LookupError, match="plugd_temporary_kit_bare .model_type 'kit_bare'. defines no TINY_CONFIG"):
        tiny_checkpoint(tmp_path / "b", "kit_bare")


def test_server_factory_loads_only_the_chosen_plugins(plugd_temporary_plugins, plugd_server_factory):
    plugd_temporary_plugins.add("shout", SHOUT)
    server = plugd_server_factory(plugins=["shout"], env=plugd_temporary_plugins.env())
    log = server.log()
    assert "shout (ok)" in log and "qwen (disabled)" in log and "jinja_renderer (ok)" in log


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return load_model(checkpoints.write_checkpoint(tmp_path_factory.mktemp("qwen3"), "qwen3", seed=9), qwen3)


def test_parity_holds_against_the_same_model_recomputed_without_a_cache(tiny_model):
    report = assert_parity(tiny_model, tiny_model, decode_tokens=8)
    assert report.logits_difference == 0 and len(report.ours) == 8


def test_parity_fails_on_a_reference_that_differs(tiny_model):
    with pytest.raises(AssertionError, match="logits differ by"):
        assert_parity(tiny_model, lambda tokens: tiny_model(tokens) * 1.01)
    # Logits moved one vocabulary entry along: any tolerance passes them, but greedy decoding picks other tokens.
    with pytest.raises(AssertionError, match="greedy tokens differ"):
        assert_parity(tiny_model, lambda tokens: mx.roll(tiny_model(tokens), 1, axis=-1), tolerance=float("inf"))
