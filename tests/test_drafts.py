"""A model with a draft (speculative decoding's smaller model, sharing its vocabulary): created with `--draft` or a
Modelfile's DRAFT from a directory or a stored model, or through /api/create's `draft_files` as Ollama's API takes
it; a draft with another vocabulary or an architecture no plugin runs is refused (400, saying why); /api/show and
the memory estimate count it; the runner loads it from the model directory it is given, in plugd's layout and in
Ollama's, pulled from a real registry. (The ollama Python client has no field for a draft: the raw body is Ollama's.)"""

from __future__ import annotations

import json
import shutil

import httpx
import mlx.core as mx
import ollama
import pytest

from plugd.constants import CACHE_STEP
from plugd.registry.testing import DockerRegistry
from plugd.runner.draft import load_draft
from plugd.runner.loading import load_model
from plugd.store.manifests import Manifest
from plugd.store.names import ModelName
from plugd.store.store import Store
from plugd.testing.architectures import architecture_module
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.ollama_models import upload, write_ollama_model

TOKENS = mx.array([[1, 5, 9, 30, 2, 7, 11]])
QWEN3 = "plugd_qwen.qwen3"
DRAFT_SHAPE = {"num_hidden_layers": 1, "num_key_value_heads": 1}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The model, its draft (a one-layer qwen3 with the same tiny tokenizer), and drafts that cannot be one."""
    root = tmp_path_factory.mktemp("drafts")
    unknown = shutil.copytree(write_checkpoint(root / "draft", "qwen3", seed=2, overrides=DRAFT_SHAPE), root / "unknown")
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps(config | {"model_type": "nonesuch"}))
    return {"model": write_checkpoint(root / "model", "qwen3", seed=1), "draft": root / "draft", "unknown": unknown,
            "other_vocabulary": write_checkpoint(root / "other", "qwen3", seed=3, vocab_size=384)}


@pytest.fixture(scope="module")
def server(plugd_server_factory, checkpoints):
    """Holding "plain" (the model alone) and "drafted" (with its draft, from the draft's directory)."""
    live = plugd_server_factory(env={"PLUGD_NUM_PARALLEL": "1"})
    live.cli("create", "plain", "--from", str(checkpoints["model"]), check=True)
    live.cli("create", "drafted", "--from", str(checkpoints["model"]), "--draft", str(checkpoints["draft"]), check=True)
    return live


def stored_model_dir(live, name, directory):
    """The directory the daemon hands the model's runner: its files as links to their blobs."""
    store = Store(live.models)
    for path, layer in store.get(ModelName.parse(name)).manifest.files().items():
        (directory / path).parent.mkdir(parents=True, exist_ok=True)
        (directory / path).symlink_to(store.blobs.path(layer.digest))
    return directory


def test_the_draft_is_stored_under_draft_and_shown(server):
    model = Store(server.models).get(ModelName.parse("drafted"))
    names = {layer.name for layer in model.manifest.layers}
    assert {"draft/config.json", "draft/model.safetensors", "draft/tokenizer.json"} <= names
    assert "model.safetensors" in names
    info = ollama.Client(host=server.url).show("drafted").modelinfo
    assert info["draft.architecture"] == "qwen3"
    assert info["draft.parameter_count"] < info["general.parameter_count"]
    assert info["general.parameter_count"] == ollama.Client(host=server.url).show("plain").modelinfo[
        "general.parameter_count"]
    assert "draft.architecture" not in ollama.Client(host=server.url).show("plain").modelinfo
    config = json.loads(Store(server.models).blobs.path(model.manifest.config.digest).read_bytes())
    assert config["draft"] == {"model_format": "safetensors", "architecture": "Qwen3ForCausalLM",
                               "config": "draft/config.json"}


def test_the_memory_estimate_counts_the_drafts_weights_and_caches(server, checkpoints):
    client = ollama.Client(host=server.url)
    sizes = {}
    for name in ("plain", "drafted"):
        client.generate(model=name, prompt="Hi", options={"num_predict": 1, "num_ctx": 4096})
        sizes[name] = next(m.size for m in client.ps().models if m.model.startswith(name))
        client.generate(model=name, keep_alive=0)
    config = json.loads((checkpoints["draft"] / "config.json").read_text())
    parameters = sum(a.size for a in mx.load(str(checkpoints["draft"] / "model.safetensors")).values())
    per_position = config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * config["head_dim"]
    positions = -(-4096 // CACHE_STEP) * CACHE_STEP
    assert sizes["drafted"] - sizes["plain"] == 4 * (parameters + per_position * positions)  # float32 on a CPU


def test_a_drafted_model_answers_as_it_does_alone(server):
    """The model's own tensors load without the draft's, whichever the runner does with the draft."""
    client = ollama.Client(host=server.url)
    greedy = {"num_predict": 8, "temperature": 0, "top_k": 1}
    answers = [client.generate(model=name, prompt="Hello", options=greedy).response for name in ("plain", "drafted")]
    assert answers[0] == answers[1]


def test_the_runner_loads_the_draft_as_its_own_directory_loads(server, checkpoints, tmp_path):
    directory = stored_model_dir(server, "drafted", tmp_path / "model")
    draft = load_draft(directory, QWEN3)
    assert mx.array_equal(draft(TOKENS), load_model(checkpoints["draft"], architecture_module("qwen3"))(TOKENS))
    assert len(draft.make_cache()) == 1
    assert mx.array_equal(load_model(directory, architecture_module("qwen3"))(TOKENS),
                          load_model(checkpoints["model"], architecture_module("qwen3"))(TOKENS))
    assert load_draft(stored_model_dir(server, "plain", tmp_path / "plain"), QWEN3) is None
    assert load_draft(directory, None) is None  # no installed architecture runs it: the model runs alone


def test_a_modelfile_draft_is_a_directory_or_a_stored_model(server, checkpoints, tmp_path):
    (tmp_path / "Modelfile").write_text(f"FROM {checkpoints['model']}\nDRAFT {checkpoints['draft']}\n")
    server.cli("create", "by-directory", "-f", str(tmp_path / "Modelfile"), check=True)
    server.cli("create", "small", "--from", str(checkpoints["draft"]), check=True)
    (tmp_path / "Modelfile").write_text("FROM plain\nDRAFT small\nSYSTEM Be brief.\n")
    server.cli("create", "by-name", "-f", str(tmp_path / "Modelfile"), check=True)
    store = Store(server.models)
    drafts = {name: {layer.name: layer.digest for layer in store.get(ModelName.parse(name)).manifest.layers
                     if (layer.name or "").startswith("draft/")} for name in ("drafted", "by-directory", "by-name")}
    assert drafts["by-directory"] == drafts["drafted"] == drafts["by-name"]
    (tmp_path / "Modelfile").write_text("FROM by-name\nSYSTEM Be briefer.\n")  # a model made from it keeps its draft
    server.cli("create", "inherited", "-f", str(tmp_path / "Modelfile"), check=True)
    assert ollama.Client(host=server.url).show("inherited").modelinfo["draft.architecture"] == "qwen3"


def test_ollamas_create_body_takes_draft_files(server, checkpoints):
    client = ollama.Client(host=server.url)
    files = {p.name: client.create_blob(p) for p in sorted(checkpoints["model"].iterdir())}
    draft_files = {p.name: client.create_blob(p) for p in sorted(checkpoints["draft"].iterdir())}
    reply = httpx.post(f"{server.url}/api/create", timeout=60,
                       json={"model": "uploaded", "files": files, "draft_files": draft_files, "stream": False})
    assert reply.status_code == 200, reply.text
    assert client.show("uploaded").modelinfo["draft.architecture"] == "qwen3"


@pytest.mark.parametrize(("draft", "reason"), [
    ("other_vocabulary", "the draft does not share the model's vocabulary: token id "),
    ("unknown", "the draft's model_type 'nonesuch' is run by no installed architecture plugin; installed: "),
])
def test_a_draft_that_cannot_draft_is_refused(server, checkpoints, draft, reason):
    client = ollama.Client(host=server.url)
    files = {p.name: client.create_blob(p) for p in sorted(checkpoints["model"].iterdir())}
    draft_files = {p.name: client.create_blob(p) for p in sorted(checkpoints[draft].iterdir())}
    reply = httpx.post(f"{server.url}/api/create", timeout=60,
                       json={"model": "refused", "files": files, "draft_files": draft_files})
    assert reply.status_code == 400
    assert reply.json()["error"].startswith(reason)
    result = server.cli("create", "refused", "--from", str(checkpoints["model"]), "--draft", str(checkpoints[draft]))
    assert result.returncode != 0 and reason in result.stderr
    with pytest.raises(ollama.ResponseError, match="not found"):
        client.show("refused")


def test_a_draft_given_twice_or_missing_is_refused(server, checkpoints):
    reply = httpx.post(f"{server.url}/api/create", json={"model": "x", "from": "plain", "draft": "plain",
                                                        "draft_files": {"config.json": "sha256:" + "0" * 64}})
    assert reply.status_code == 400 and "not both" in reply.json()["error"]
    reply = httpx.post(f"{server.url}/api/create", json={"model": "x", "from": "plain", "draft": "absent"})
    assert reply.status_code == 404 and reply.json()["error"] == "model 'absent:latest' not found"


# Ollama's layout: pulled from a real registry as Ollama's create leaves such a model there.

@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with DockerRegistry(tmp_path_factory.mktemp("registry")) as registry:
        yield registry


def test_an_ollama_model_with_a_draft_is_pulled_shown_and_loaded(server, registry, checkpoints, tmp_path):
    model = write_ollama_model(checkpoints["model"], tmp_path / "ollama", "drafted:mlx", draft=checkpoints["draft"])
    names = [layer.get("name") for layer in json.loads(model.manifest)["layers"]]
    assert "draft.model.layers.0.self_attn.q_proj.weight" in names and "draft/config.json" in names
    upload(model, registry.url, "test/drafted", "mlx")
    name = f"{registry.address}/test/drafted:mlx"
    server.cli("pull", name, check=True)
    client = ollama.Client(host=server.url)
    assert client.show(name).modelinfo["draft.architecture"] == "qwen3"
    assert client.show(name).modelinfo["general.parameter_count"] == client.show("plain").modelinfo[
        "general.parameter_count"]

    stored = Store(server.models).get(ModelName.parse(name)).manifest
    assert stored.to_bytes() == Manifest.from_bytes(model.manifest).to_bytes()
    directory = stored_model_dir(server, name, tmp_path / "model")
    draft = load_draft(directory, QWEN3)
    assert mx.array_equal(draft(TOKENS), load_model(checkpoints["draft"], architecture_module("qwen3"))(TOKENS))
    assert mx.array_equal(load_model(directory, architecture_module("qwen3"))(TOKENS),
                          load_model(checkpoints["model"], architecture_module("qwen3"))(TOKENS))
    greedy = {"num_predict": 8, "temperature": 0, "top_k": 1}
    assert client.generate(model=name, prompt="Hello", options=greedy).response == client.generate(
        model="plain", prompt="Hello", options=greedy).response
