"""End to end: a real `plugd serve` driven by the official `ollama` Python client."""

import json

import httpx
import ollama
import pytest
from packaging.version import Version

from plugd import __version__
from plugd.server.ollama import OLLAMA_API_VERSION


@pytest.fixture
def client(plugd_server):
    return ollama.Client(host=plugd_server.url)


def create_from_dir(client, name, directory, **fields):
    files = {p.name: client.create_blob(p) for p in sorted(directory.iterdir())}
    return client.create(model=name, files=files, **fields)


def test_create_from_uploaded_blobs_then_list_and_show(client, tiny_qwen3):
    response = create_from_dir(client, "tiny", tiny_qwen3, system="You are terse.", parameters={"temperature": 0.2})
    assert response.status == "success"

    (entry,) = client.list().models
    assert entry.model == "tiny:latest"
    assert entry.size > (tiny_qwen3 / "model.safetensors").stat().st_size
    assert entry.details.family == "qwen3"
    assert entry.details.format == "safetensors"
    assert entry.details.quantization_level == "F32"

    shown = client.show("tiny")
    assert 'SYSTEM """You are terse."""' in shown.modelfile
    assert "temperature" in shown.parameters and "0.2" in shown.parameters
    assert shown.modelinfo["general.architecture"] == "qwen3"
    assert shown.modelinfo["qwen3.context_length"] == 4096
    config = json.loads((tiny_qwen3 / "config.json").read_text())
    assert {key: shown.modelinfo[f"qwen3.{key}"] for key in ("embedding_length", "block_count", "attention.head_count",
                                                              "attention.head_count_kv", "rope.freq_base")} == {
        "embedding_length": config["hidden_size"], "block_count": config["num_hidden_layers"],
        "attention.head_count": config["num_attention_heads"], "attention.head_count_kv": config["num_key_value_heads"],
        "rope.freq_base": config["rope_theta"]}
    assert set(shown.capabilities) == {"completion", "tools", "thinking"}
    assert "<|im_start|>" in shown.template
    assert "FROM tiny:latest" in shown.modelfile


def test_streaming_create_reports_progress(client, tiny_qwen3):
    files = {p.name: client.create_blob(p) for p in sorted(tiny_qwen3.iterdir())}
    statuses = [part.status for part in client.create(model="tiny", files=files, stream=True)]
    assert statuses[0] == "parsing model files"
    assert statuses[-2:] == ["writing manifest", "success"]


def test_copy_and_delete(client, tiny_qwen3):
    create_from_dir(client, "tiny", tiny_qwen3)
    client.copy("tiny", "me/tiny-copy:v2")
    names = {m.model for m in client.list().models}
    assert names == {"tiny:latest", "me/tiny-copy:v2"}
    assert client.show("me/tiny-copy:v2").details.family == "qwen3"

    client.delete("tiny")
    assert {m.model for m in client.list().models} == {"me/tiny-copy:v2"}
    assert client.show("me/tiny-copy:v2").details.family == "qwen3"


def test_errors_reach_the_client_with_ollama_status_codes(client, tiny_qwen3):
    with pytest.raises(ollama.ResponseError) as missing:
        client.show("no-such-model")
    assert missing.value.status_code == 404
    assert "not found" in missing.value.error

    with pytest.raises(ollama.ResponseError) as bad_name:
        client.delete("../../etc/passwd")
    assert bad_name.value.status_code == 400

    with pytest.raises(ollama.ResponseError) as copy_missing:
        client.copy("absent", "other")
    assert copy_missing.value.status_code == 404

    with pytest.raises(ollama.ResponseError) as no_blob:
        client.create(model="x", files={"config.json": "sha256:" + "0" * 64})
    assert no_blob.value.status_code == 400
    assert "not in the store" in no_blob.value.error


def test_create_from_existing_model(client, tiny_qwen3):
    create_from_dir(client, "base", tiny_qwen3)
    client.create(model="derived", from_="base", system="Derived.", messages=[{"role": "user", "content": "hi"}])
    shown = client.show("derived")
    assert 'SYSTEM """Derived."""' in shown.modelfile
    assert 'MESSAGE user """hi"""' in shown.modelfile


def test_root_and_version(plugd_server):
    assert httpx.get(plugd_server.url).text == "Ollama is running"
    head = httpx.head(plugd_server.url)
    assert head.status_code == 200 and head.content == b""
    version = httpx.get(plugd_server.url + "/api/version")
    assert version.json() == {"version": OLLAMA_API_VERSION, "plugd": __version__}
    assert version.headers["server"] == f"plugd/{__version__}"
    assert Version(OLLAMA_API_VERSION) >= Version("0.13.4")  # the oldest Ollama `codex --oss` accepts
    assert httpx.get(plugd_server.url + "/api/nothing-here").json() == {"error": "Not Found"}
