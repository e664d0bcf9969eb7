"""A blob that changed on disk is not served: every load checks the model's blobs against their sizes and, where
one changed since the store last saw it, its digest; a damaged model says so in the load error, /api/show and
/api/tags (and `plugd list`), and a blob only touched loads as before."""

import json
import os

import httpx
import pytest


@pytest.fixture
def model(plugd_server, tiny_qwen3, tmp_path):
    (tmp_path / "Modelfile").write_text(f"FROM {tiny_qwen3}\nPARAMETER num_predict 1\n")
    assert plugd_server.cli("create", "m", "-f", str(tmp_path / "Modelfile")).returncode == 0
    assert generate(plugd_server).status_code == 200
    assert "damaged" not in httpx.post(f"{plugd_server.url}/api/show", json={"model": "m"}).json()
    manifest = plugd_server.models / "manifests" / "registry.ollama.ai" / "library" / "m" / "latest"
    layers = json.loads(manifest.read_text())["layers"]
    digest = next(layer["digest"] for layer in layers if layer.get("name") == "model.safetensors")
    return plugd_server.models / "blobs" / digest.replace(":", "-"), digest


def generate(server):
    return httpx.post(f"{server.url}/api/generate", json={"model": "m", "prompt": "hi", "stream": False},
                      timeout=120)


def unload(server):
    httpx.post(f"{server.url}/api/generate", json={"model": "m", "keep_alive": 0}, timeout=60)


def test_flipped_bytes_are_found_at_the_next_load(plugd_server, model):
    blob, digest = model
    unload(plugd_server)
    with blob.open("r+b") as f:
        f.seek(blob.stat().st_size // 2)
        f.write(b"\xff" * 4096)
    response = generate(plugd_server)
    problem = f"blob {digest} (model.safetensors) no longer matches its sha256 digest"
    assert response.status_code == 500
    assert response.json() == {"error": f"model 'm:latest' is damaged: {problem}; pull or create it again"}
    assert str(plugd_server.models) not in response.text
    listed = httpx.get(f"{plugd_server.url}/api/tags").json()["models"]
    assert [entry["damaged"] for entry in listed] == [problem.replace("no longer matches its sha256 digest",
                                                                      "changed on disk since it was last verified")]
    assert "m:latest is damaged" in plugd_server.cli("list").stderr


def test_a_deleted_blob_is_reported_by_show_list_and_the_load(plugd_server, model):
    blob, digest = model
    unload(plugd_server)
    blob.unlink()
    problem = f"blob {digest} (model.safetensors) is missing"
    assert generate(plugd_server).json()["error"] == f"model 'm:latest' is damaged: {problem}; pull or create it again"
    assert httpx.post(f"{plugd_server.url}/api/show", json={"model": "m"}).json()["damaged"] == problem
    assert [entry["damaged"] for entry in httpx.get(f"{plugd_server.url}/api/tags").json()["models"]] == [problem]


def test_a_blob_only_touched_is_verified_and_loads(plugd_server, model):
    blob, _ = model
    unload(plugd_server)
    later = blob.stat().st_mtime + 60
    os.utime(blob, (later, later))
    assert generate(plugd_server).status_code == 200
    assert "damaged" not in httpx.get(f"{plugd_server.url}/api/tags").json()["models"][0]


def test_verify_hashes_every_blob_even_one_whose_mtime_was_kept(plugd_server, model):
    blob, digest = model
    assert plugd_server.cli("verify").stdout == "m:latest: ok\n"
    stat = blob.stat()
    with blob.open("r+b") as f:
        f.seek(100)
        f.write(b"\0" * 16)
    os.utime(blob, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # what a load's quick check cannot see
    result = plugd_server.cli("verify", "m")
    assert result.returncode == 1
    assert result.stdout == f"m:latest: damaged: blob {digest} (model.safetensors) no longer matches its sha256 digest\n"
