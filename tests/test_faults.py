"""Bad input and broken state over HTTP: the daemon answers in Ollama's error shape and loses nothing."""

import hashlib
import json
import threading
import time
from pathlib import Path

import httpx
import ollama
import pytest

from plugd.testing.server import LiveServer


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def upload_dir(url, directory):
    client = ollama.Client(host=url)
    return {p.name: client.create_blob(p) for p in sorted(directory.iterdir())}


def test_upload_with_wrong_digest_is_refused(plugd_server):
    wrong = sha(b"something else")
    response = httpx.post(f"{plugd_server.url}/api/blobs/{wrong}", content=b"payload")
    assert response.status_code == 400
    assert response.json()["error"].startswith("digest mismatch")
    assert httpx.head(f"{plugd_server.url}/api/blobs/{wrong}").status_code == 404
    assert httpx.head(f"{plugd_server.url}/api/blobs/{sha(b'payload')}").status_code == 404
    assert list((plugd_server.models / "blobs").iterdir()) == []


@pytest.mark.parametrize("digest", ["sha256:short", "sha256-" + "0" * 63, "..%2F..%2Fetc", "sha512:" + "0" * 64])
def test_malformed_digests(plugd_server, digest):
    response = httpx.post(f"{plugd_server.url}/api/blobs/{digest}", content=b"x")
    assert response.status_code in (400, 404)
    assert "error" in response.json()


def test_server_killed_mid_upload_leaves_nothing_visible(tmp_path):
    models = tmp_path / "models"
    server = LiveServer(models)
    data = b"\x42" * (8 << 20)
    digest = sha(data)
    sent = threading.Event()

    def slow_body():
        for i in range(0, len(data), 1 << 20):
            yield data[i : i + (1 << 20)]
            if i >= 3 << 20:
                sent.set()
                time.sleep(60)  # the server dies while we wait

    def upload():
        try:
            httpx.post(f"{server.url}/api/blobs/{digest}", content=slow_body(), timeout=120)
        except httpx.HTTPError:
            pass

    uploader = threading.Thread(target=upload, daemon=True)
    uploader.start()
    assert sent.wait(30)
    time.sleep(0.5)
    server.kill()
    blobs = models / "blobs"
    assert not (blobs / digest.replace(":", "-")).exists()
    assert [p.name for p in blobs.iterdir() if p.name.startswith(".partial-")], "the upload should have been underway"

    restarted = LiveServer(models)
    try:
        assert list(blobs.iterdir()) == []
        assert httpx.head(f"{restarted.url}/api/blobs/{digest}").status_code == 404
        assert httpx.post(f"{restarted.url}/api/blobs/{digest}", content=data).status_code == 201
        assert (blobs / digest.replace(":", "-")).read_bytes() == data
    finally:
        restarted.stop()


@pytest.mark.parametrize(
    "method, path, body, message",
    [
        ("POST", "/api/show", b"{not json", "invalid JSON body"),
        ("POST", "/api/show", b"[1, 2]", "must be a JSON object"),
        ("POST", "/api/show", b"{}", "model is required"),
        ("POST", "/api/show", b'{"model": 42}', "expected str"),
        ("POST", "/api/copy", b'{"source": "a"}', "destination"),
        ("POST", "/api/copy", b'{"source": "a", "destination": "b/../c"}', "invalid model name"),
        ("DELETE", "/api/delete", b"\xff\xfe", "invalid JSON body"),
        ("DELETE", "/api/delete", b'{"model": "bad name"}', "invalid model name"),
        ("POST", "/api/create", b'{"model": "x", "files": "nope"}', "invalid request body"),
        ("POST", "/api/create", b'{"model": "x", "stream": "yes"}', "expected bool"),
        ("POST", "/api/create", b'{"model": "x"}', "neither 'from' nor 'files'"),
        ("POST", "/api/create", b'{"model": "x", "parameters": {"temperature": "hot"}, "from": "y"}', "not found"),
    ],
)
def test_malformed_bodies_get_a_400_in_ollama_shape(plugd_server, method, path, body, message):
    response = httpx.request(method, plugd_server.url + path, content=body)
    assert response.status_code in (400, 404)
    assert message in response.json()["error"]


def test_concurrent_creates_of_one_name(plugd_server, tiny_qwen3):
    files = upload_dir(plugd_server.url, tiny_qwen3)
    systems = [f"variant {i}" for i in range(6)]
    results = []

    def create(system):
        client = ollama.Client(host=plugd_server.url)
        results.append(client.create(model="same", files=files, system=system).status)

    threads = [threading.Thread(target=create, args=(s,)) for s in systems]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["success"] * len(systems)
    modelfile = ollama.Client(host=plugd_server.url).show("same").modelfile
    assert sum(f'SYSTEM """{s}"""' in modelfile for s in systems) == 1
    assert [m.model for m in ollama.Client(host=plugd_server.url).list().models] == ["same:latest"]


def test_malformed_store_files(plugd_server, tiny_qwen3):
    client = ollama.Client(host=plugd_server.url)
    client.create(model="good", files=upload_dir(plugd_server.url, tiny_qwen3))
    client.copy("good", "badconfig")

    manifests = plugd_server.models / "manifests/registry.ollama.ai/library"
    (manifests / "broken").mkdir()
    (manifests / "broken" / "latest").write_text("{truncated")
    # Point one model at a config blob that is not JSON.
    bad_config = b"\x00 not json"
    httpx.post(f"{plugd_server.url}/api/blobs/{sha(bad_config)}", content=bad_config).raise_for_status()
    path = manifests / "badconfig" / "latest"
    manifest = json.loads(path.read_text())
    manifest["config"] |= {"digest": sha(bad_config), "size": len(bad_config)}
    path.write_text(json.dumps(manifest))

    assert [m.model for m in client.list().models] == ["good:latest"]
    for name, reason in (("broken", "malformed"), ("badconfig", "not valid JSON")):
        with pytest.raises(ollama.ResponseError) as err:
            client.show(name)
        assert err.value.status_code == 500
        assert reason in err.value.error
    assert client.show("good").details.family == "qwen3"



def test_runners_end_with_a_daemon_that_is_killed(tmp_path, tiny_qwen3):
    server = LiveServer(tmp_path / "models")
    try:
        server.cli("create", "tiny", "--from", str(tiny_qwen3), check=True)
        ollama.Client(host=server.url).generate(model="tiny", prompt="Hi", options={"num_predict": 2})
        (runner,) = server.runner_pids()
        server.kill()  # SIGKILL: no shutdown, nobody to stop the runner
        deadline = time.monotonic() + 15
        while alive(runner) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(runner)
    finally:
        server.stop()


def alive(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie waiting for its reaper has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
