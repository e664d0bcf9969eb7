"""Ollama's MLX (safetensors) model format: loaded layer by layer like its twin directory checkpoint, then end to end:
put on a real docker-registry as Ollama leaves it, pulled into an empty store, run, shown, built on, pushed back."""

import hashlib
import json

import httpx
import mlx.core as mx
import ollama
import pytest

from plugd.registry.testing import DockerRegistry
from plugd.runner.errors import CheckpointError
from plugd.runner.loading import load_model
from plugd.store import manifests as mt
from plugd.store.manifests import Manifest
from plugd.store.names import ModelName
from plugd.testing.architectures import architecture_module
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.ollama_models import OllamaModel, upload, write_ollama_model, write_twin
from plugd.testing.server import LiveServer

PROMPT = mx.array([[1, 5, 9, 30, 2, 7, 11]])
qwen3_moe = architecture_module("qwen3_moe")
GREEDY = {"temperature": 0, "top_k": 1, "num_predict": 12, "seed": 0}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny qwen3_moe whose expert projections all fill whole groups of 64, so int8 stacks them in one layer."""
    return write_checkpoint(tmp_path_factory.mktemp("moe"), "qwen3_moe", seed=3, overrides={"moe_intermediate_size": 64})


def model_dir(model: OllamaModel, directory):
    """The directory the daemon hands a runner: the manifest's files as links to their blobs."""
    for name, layer in Manifest.from_bytes(model.manifest).files().items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).symlink_to(model.blob(layer.digest))
    return directory


CASES = [("stacked", None), ("stacked", "int4"), ("stacked", "int8"), ("switch_mlp", "int4"), ("per_expert", None),
         ("per_expert", "int4"), ("stacked", "mxfp8"), ("per_expert", "nvfp4"), ("switch_mlp", "mxfp4")]


@pytest.mark.parametrize(("experts", "quantize"), CASES)
def test_loads_exactly_as_its_twin(checkpoint, tmp_path, experts, quantize):
    model = write_ollama_model(checkpoint, tmp_path / "ollama", f"tiny:{experts}", quantize=quantize, experts=experts)
    ours = load_model(model_dir(model, tmp_path / "dir"), qwen3_moe)
    twin = load_model(write_twin(checkpoint, tmp_path / "twin", quantize), qwen3_moe)
    logits, expected = ours(PROMPT), twin(PROMPT)
    assert mx.array_equal(logits, expected)
    layer = ours.model.layers[0]
    bits = {"int4": (4, 8, 8), "int8": (8, 8, 8)}.get(quantize)  # int4 keeps experts' down_proj and k_proj at 8 bits
    if bits:
        assert (layer.mlp.switch_mlp.gate_proj.bits, layer.mlp.switch_mlp.down_proj.bits, layer.self_attn.k_proj.bits) == bits
        assert not mx.array_equal(logits, load_model(checkpoint, qwen3_moe)(PROMPT))
    else:
        assert not hasattr(layer.mlp.switch_mlp.gate_proj, "bits")  # fp modes are dequantized; no layer quantized


def test_the_layers_are_as_ollama_writes_them(checkpoint, tmp_path):
    stacked = json.loads(write_ollama_model(checkpoint, tmp_path / "a", "a:int8", quantize="int8").manifest)
    names = [layer.get("name") for layer in stacked["layers"]]
    assert "model.layers.1.mlp.experts" in names and "model.layers.0.self_attn.q_proj.weight" in names
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= set(names)
    group = next(layer for layer in stacked["layers"] if layer.get("name") == "model.layers.1.mlp.experts")
    blob = tmp_path / "a" / "blobs" / group["digest"].replace(":", "-")
    arrays, metadata = mx.load(str(blob), format="safetensors", return_metadata=True)
    assert metadata == {"quant_type": "int8", "group_size": "64"}
    assert sorted(arrays) == [f"model.layers.1.mlp.experts.{p}.weight{s}" for p in ("down_proj", "gate_proj", "up_proj")
                              for s in ("", ".bias", ".scale")]
    per_expert = json.loads(write_ollama_model(checkpoint, tmp_path / "b", "b:x", experts="per_expert").manifest)
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in [layer.get("name") for layer in per_expert["layers"]]


def relabel(model: OllamaModel, layer_name: str, quant_type: str) -> OllamaModel:
    """The model with one tensor layer's quant_type changed to `quant_type`, its manifest rewritten."""
    manifest = json.loads(model.manifest)
    layer = next(layer for layer in manifest["layers"] if layer.get("name") == layer_name)
    arrays, metadata = mx.load(str(model.blob(layer["digest"])), format="safetensors", return_metadata=True)
    path = model.root / "relabelled.safetensors"
    mx.save_safetensors(str(path), arrays, metadata=metadata | {"quant_type": quant_type})
    data = path.read_bytes()
    layer |= {"digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}
    model.blob(layer["digest"]).write_bytes(data)
    model.root.joinpath("manifests", *model.name.parts).write_bytes(json.dumps(manifest, separators=(",", ":")).encode())
    return model


def test_an_unknown_quantization_type_is_refused_naming_the_tensor(checkpoint, tmp_path):
    model = write_ollama_model(checkpoint, tmp_path / "ollama", "tiny:q", quantize="int4")
    relabel(model, "model.layers.0.self_attn.o_proj.weight", "int3")
    with pytest.raises(CheckpointError, match="tensor model.layers.0.self_attn.o_proj.weight is quantized as 'int3', "
                                              "which plugd cannot load; it loads int4, int8, nvfp4, mxfp4, mxfp8"):
        load_model(model_dir(model, tmp_path / "dir"), qwen3_moe)


# End to end: a real docker-registry, a real `plugd serve` with its runners.

@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with DockerRegistry(tmp_path_factory.mktemp("registry")) as registry:
        yield registry


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = LiveServer(tmp_path_factory.mktemp("daemon") / "models")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def published(checkpoint, registry, tmp_path_factory):
    """Ollama-format models on the registry by tag (test/moe:TAG), with their manifest digests."""
    root = tmp_path_factory.mktemp("ollama")
    models = {
        "int4": write_ollama_model(checkpoint, root, "moe:int4", quantize="int4"),
        "int8-per-expert": write_ollama_model(checkpoint, root, "moe:int8-per-expert", quantize="int8",
                                              experts="per_expert"),
        # Ollama names plugd has no plugin for (qwen3.8) or has under another name (qwen3-thinking), a system prompt.
        "bf": write_ollama_model(checkpoint, root, "moe:bf", renderer="qwen3.8", parser="qwen3-thinking",
                                 capabilities=("completion", "tools", "thinking"), system="Answer briefly."),
    }
    bad = relabel(write_ollama_model(checkpoint, root, "moe:int3", quantize="int4"),
                  "model.layers.0.self_attn.o_proj.weight", "int3")
    return {tag: upload(model, registry.url, "test/moe", tag) for tag, model in {**models, "int3": bad}.items()}


def generate(server, model, prompt="the cat sat"):
    return ollama.Client(host=server.url).generate(model=model, prompt=prompt, raw=True, options=GREEDY)


@pytest.fixture(scope="module")
def pulled(server, registry, published):
    names = {tag: f"{registry.address}/test/moe:{tag}" for tag in published}
    for tag in ("int4", "int8-per-expert", "bf", "int3"):
        pull = server.cli("pull", names[tag])
        assert pull.returncode == 0, pull.stderr + server.log()
    return names


@pytest.mark.parametrize(("tag", "quantize"), [("int4", "int4"), ("int8-per-expert", "int8"), ("bf", None)])
def test_pulled_runs_as_the_checkpoint_created_from_its_directory(server, pulled, checkpoint, tmp_path, tag, quantize):
    twin = f"twin-{tag}"
    server.cli("create", twin, "--from", str(write_twin(checkpoint, tmp_path / "twin", quantize)), check=True)
    ours, expected = generate(server, pulled[tag]), generate(server, twin)
    assert ours.response and ours.eval_count == 12
    assert ours.response == expected.response


def test_push_sends_the_pulled_model_back_unchanged(server, registry, pulled, published):
    for tag in ("int4", "int8-per-expert"):
        copy = f"{registry.address}/test/copy:{tag}"
        server.cli("cp", pulled[tag], copy, check=True)
        push = server.cli("push", copy)
        assert push.returncode == 0, push.stderr
        response = httpx.get(f"{registry.url}/v2/test/copy/manifests/{tag}",
                             headers={"Accept": mt.MANIFEST_MEDIA_TYPE})
        assert "sha256:" + hashlib.sha256(response.content).hexdigest() == published[tag]
        assert response.headers["docker-content-digest"] == published[tag]
        listed = {m.model: m.digest for m in ollama.Client(host=server.url).list().models}
        assert listed[pulled[tag]] == published[tag].removeprefix("sha256:")


def test_show_reads_ollamas_config_blob(server, pulled, checkpoint, tmp_path):
    client = ollama.Client(host=server.url)
    server.cli("create", "twin-show", "--from", str(write_twin(checkpoint, tmp_path / "twin", "int4")), check=True)
    shown, twin = client.show(pulled["int4"]), client.show("twin-show")
    assert shown.details.format == "safetensors" and shown.details.family == "qwen3_moe"
    assert shown.details.quantization_level == "int4"  # Ollama's file_type
    assert shown.details.parameter_size == twin.details.parameter_size
    assert shown.modelinfo["general.parameter_count"] == twin.modelinfo["general.parameter_count"]
    assert shown.modelinfo["qwen3_moe.expert_count"] == 4
    assert shown.capabilities == ["completion", "tools"]  # as Ollama's config says
    raw = httpx.post(f"{server.url}/api/show", json={"model": pulled["int4"]}).json()
    assert (raw["renderer"], raw["parser"]) == ("qwen3-coder", "qwen3")  # installed under Ollama's names

    other = httpx.post(f"{server.url}/api/show", json={"model": pulled["bf"]}).json()
    assert other["parser"] == "qwen3"  # Ollama's qwen3-thinking is the qwen3 parser with thinking on
    assert other["renderer"] == "jinja"  # no qwen3.8 renderer here: the checkpoint's own chat template
    assert other["capabilities"] == ["completion", "tools", "thinking"] and other["system"] == "Answer briefly."
    assert other["details"]["quantization_level"] == "F32"
    reply = client.chat(model=pulled["bf"], messages=[{"role": "user", "content": "hi"}], options=GREEDY)
    assert reply.done and reply.eval_count > 0


def test_create_from_an_ollama_model_keeps_its_layers(server, pulled, tmp_path):
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text(f"FROM {pulled['int4']}\nSYSTEM You are terse.\n")
    server.cli("create", "terse", "-f", str(modelfile), check=True)
    shown = httpx.post(f"{server.url}/api/show", json={"model": "terse"}).json()
    assert shown["system"] == "You are terse." and shown["details"]["family"] == "qwen3_moe"
    assert shown["capabilities"] == ["completion", "tools"] and shown["renderer"] == "qwen3-coder"
    source, derived = (json.loads(server.models.joinpath("manifests", *ModelName.parse(name).parts).read_bytes())
                       for name in (pulled["int4"], "terse"))
    kept = {mt.OLLAMA_TENSOR, mt.OLLAMA_JSON}
    assert sorted((x["digest"], x["name"]) for x in derived["layers"] if x["mediaType"] in kept) == sorted(
        (x["digest"], x["name"]) for x in source["layers"] if x["mediaType"] in kept)
    assert generate(server, "terse").response == generate(server, pulled["int4"]).response


def test_an_unknown_quantization_type_fails_the_load_and_the_daemon_stays_up(server, pulled):
    with pytest.raises(ollama.ResponseError, match="tensor model.layers.0.self_attn.o_proj.weight is quantized as "
                                                   "'int3', which plugd cannot load") as refused:
        generate(server, pulled["int3"])
    assert refused.value.status_code == 400
    assert generate(server, pulled["int4"]).response


def test_a_gguf_model_is_refused_saying_what_to_pull_instead(server, registry, tmp_path):
    model = OllamaModel(tmp_path, ModelName.parse("gguf:latest"))
    (tmp_path / "blobs").mkdir()
    layers = []
    for media_type, data in ((mt.CONFIG_MEDIA_TYPE, b'{"model_format":"gguf"}'), (mt.GGUF_WEIGHTS, b"GGUF" + bytes(64)),
                             (mt.TEMPLATE, b"{{ .Prompt }}")):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        model.blob(digest).write_bytes(data)
        layers.append({"mediaType": media_type, "digest": digest, "size": len(data)})
    manifest = {"schemaVersion": 2, "mediaType": mt.MANIFEST_MEDIA_TYPE, "config": layers[0], "layers": layers[1:]}
    path = tmp_path.joinpath("manifests", *model.name.parts)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(manifest))
    upload(model, registry.url, "library/gguf", "latest")
    name = f"{registry.address}/library/gguf:latest"
    error = server.cli("pull", name).stderr.splitlines()[-1]
    assert error == (
        f"Error: {name} is a GGUF model, the llama.cpp format Ollama runs; plugd runs safetensors models on MLX. Instead, "
        "pull a tag of it in Ollama's MLX (safetensors) format where one is published (e.g. a tag ending in -mlx), pull "
        "its safetensors checkpoint from the Hugging Face Hub (plugd pull hf.co/ORG/REPO), or create it from a Hugging "
        "Face model directory (plugd create NAME --from DIR)")
    assert "gguf" not in server.cli("list").stdout


def test_a_layer_named_outside_the_model_directory_is_refused(server, registry, checkpoint, tmp_path):
    model = write_ollama_model(checkpoint, tmp_path, "evil:x")
    manifest = json.loads(model.manifest)
    next(layer for layer in manifest["layers"] if layer.get("name") == "config.json")["name"] = "../config.json"
    tmp_path.joinpath("manifests", *model.name.parts).write_text(json.dumps(manifest))
    upload(model, registry.url, "test/evil", "x")
    name = f"{registry.address}/test/evil:x"
    assert server.cli("pull", name).stderr.splitlines()[-1] == (
        f"Error: the manifest of {name} names a file outside the model directory: '../config.json'")
