"""End to end: `plugd push` and `plugd pull` between two real daemons and a real registry (Debian's docker-registry
on loopback), then the pulled model answers; errors reach the CLI and the ollama client; mounts; bearer tokens."""

import hashlib
import json

import httpx
import ollama
import pytest

from plugd.registry.testing import Certificate, DockerRegistry, Front, TokenServer
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.server import LiveServer, free_port


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with DockerRegistry(tmp_path_factory.mktemp("registry")) as registry:
        yield registry


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A daemon holding `tiny`, made from a tiny qwen3 checkpoint."""
    root = tmp_path_factory.mktemp("source")
    server = LiveServer(root / "models")
    try:
        server.cli("create", "tiny", "--from", str(write_checkpoint(root / "checkpoint", "qwen3", seed=0)), check=True)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def pushed(source, registry):
    """`tiny` pushed to the registry as test/tiny:v1, with the CLI's output."""
    name = f"{registry.address}/test/tiny:v1"
    source.cli("cp", "tiny", name, check=True)
    return name, source.cli("push", name)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    server = LiveServer(tmp_path_factory.mktemp("target") / "models")
    yield server
    server.stop()


@pytest.fixture
def target(daemon):
    """The second daemon, its store emptied."""
    client = ollama.Client(host=daemon.url)
    for model in client.list().models:
        client.delete(model.model)
    return daemon


def manifest_of(server, name):
    host, namespace, rest = name.split("/")
    model, tag = rest.split(":")
    return (server.models / "manifests" / host / namespace / model / tag).read_bytes()


def test_push_then_pull_into_an_empty_store_then_run(source, pushed, target):
    name, push = pushed
    assert push.returncode == 0, push.stderr
    assert push.stderr.splitlines()[0] == "retrieving manifest"
    assert push.stderr.splitlines()[-2:] == ["pushing manifest", "success"]

    pull = target.cli("pull", name)
    assert pull.returncode == 0, pull.stderr + target.log()
    lines = pull.stderr.splitlines()
    assert lines[0] == "pulling manifest" and lines[-1] == "success"
    manifest = json.loads(manifest_of(source, name))
    for layer in [manifest["config"], *manifest["layers"]]:
        assert f"pulling {layer['digest'][7:19]}: 100% ▕{'█' * 25}▏" in pull.stderr
    assert manifest_of(target, name) == manifest_of(source, name)
    assert name in target.cli("list").stdout

    reply = ollama.Client(host=target.url).generate(model=name, prompt="hello", options={"num_predict": 3})
    assert reply.done and reply.eval_count == 3


def test_a_second_pull_fetches_nothing(pushed, registry, target):
    name, _ = pushed
    with Front(registry.url) as front:
        through_front = f"{front.address}/test/tiny:v1"
        client = ollama.Client(host=target.url)
        assert client.pull(through_front).status == "success"
        assert len(front.blob_gets()) >= 3
        front.log.clear()
        assert client.pull(through_front).status == "success"
        assert front.blob_gets() == []
        assert [m for m, _, _ in front.log] == ["GET", "GET"]  # /v2/ and the manifest


def test_errors_a_user_can_act_on(pushed, registry, target):
    unknown_model = target.cli("pull", f"{registry.address}/test/nothing")
    assert unknown_model.returncode == 1
    assert unknown_model.stderr.splitlines()[-1] == f"Error: unknown model 'test/nothing' on registry {registry.address}"

    client = ollama.Client(host=target.url)
    with pytest.raises(ollama.ResponseError, match="model 'test/tiny' has no tag 'v9' on registry .*; it has v1"):
        client.pull(f"{registry.address}/test/tiny:v9")
    with pytest.raises(ollama.ResponseError, match="registry 127.0.0.1:.* is unreachable"):
        client.pull(f"127.0.0.1:{free_port()}/test/tiny")
    with pytest.raises(ollama.ResponseError, match="not found") as absent:
        client.push(f"{registry.address}/test/absent")
    assert absent.value.status_code == 404
    response = httpx.post(f"{target.url}/api/pull", json={"model": f"{registry.address}/test/nothing", "stream": False})
    assert response.status_code == 404 and "unknown model" in response.json()["error"]
    assert httpx.post(f"{target.url}/api/pull", json={}).status_code == 400
    assert client.list().models == []


def put_ollama_gguf_model(registry, repository):
    """A model as Ollama's registry holds one (GGUF weights and a template), put straight through the registry API."""
    base = f"{registry.url}/v2/{repository}"

    def blob(data: bytes, media_type: str) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        location = httpx.post(f"{base}/blobs/uploads/").headers["location"]
        httpx.put(httpx.URL(registry.url).join(location).copy_merge_params({"digest": digest}),
                  content=data).raise_for_status()
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": blob(b'{"model_format": "gguf"}', "application/vnd.docker.container.image.v1+json"),
                "layers": [blob(b"GGUF" + bytes(4096), "application/vnd.ollama.image.model"),
                           blob(b"{{ .Prompt }}", "application/vnd.ollama.image.template")]}
    httpx.put(f"{base}/manifests/latest", content=json.dumps(manifest),
              headers={"content-type": manifest["mediaType"]}).raise_for_status()


def test_a_gguf_model_is_refused_before_its_download(registry, target):
    put_ollama_gguf_model(registry, "library/gguf")
    name = f"{registry.address}/library/gguf:latest"
    response = httpx.post(f"{target.url}/api/pull", json={"model": name, "stream": False})
    assert response.status_code == 400
    assert response.json()["error"].startswith(f"{name} is a GGUF model, the llama.cpp format Ollama runs; plugd runs "
                                               "safetensors models on MLX.")
    assert target.cli("pull", name).stderr.splitlines()[-1].startswith(f"Error: {name} is a GGUF model")
    assert ollama.Client(host=target.url).list().models == []
    assert not [p for p in (target.models / "blobs").rglob("*") if p.is_file()]


def test_the_ollama_client_pulls_and_pushes(pushed, target, registry):
    name, _ = pushed
    client = ollama.Client(host=target.url)
    statuses = [part.status for part in client.pull(name, stream=True)]
    assert statuses[0] == "pulling manifest" and statuses[-3:] == ["verifying sha256 digest", "writing manifest",
                                                                    "success"]
    assert client.pull(name).status == "success"  # not streamed
    copy = f"{registry.address}/test/copied:v1"
    client.copy(name, copy)
    assert client.push(copy).status == "success"


def test_push_mounts_blobs_from_another_repository(source, pushed, registry):
    with Front(registry.url) as front:
        first, second = f"{front.address}/test/tiny:v1", f"{front.address}/other/tiny:v1"
        client = ollama.Client(host=source.url)
        client.copy("tiny", first)
        client.copy("tiny", second)
        assert client.push(first).status == "success"  # the registry has every blob there already
        front.log.clear()
        assert client.push(second).status == "success"
        mounts = [path for method, path, _ in front.log if method == "POST"]
        assert mounts and all("mount=sha256%3A" in p and "from=test%2Ftiny" in p for p in mounts)
        assert not [path for method, path, _ in front.log if method == "PATCH" or "/blobs/uploads/" in path and
                    method == "PUT"]
        assert ("PUT", "/v2/other/tiny/manifests/v1", None) in front.log


def test_bearer_token_challenges(source, tmp_path, target):
    certificate = Certificate(tmp_path / "tls")
    with TokenServer(certificate) as tokens, DockerRegistry(tmp_path / "registry", token=tokens) as registry:
        name = f"{registry.address}/secured/tiny:v1"
        assert httpx.get(f"{registry.url}/v2/secured/tiny/tags/list").status_code == 401
        ollama.Client(host=source.url).copy("tiny", name)
        assert ollama.Client(host=source.url).push(name).status == "success"
        assert ollama.Client(host=target.url).pull(name).status == "success"
        push_scopes, pull_scopes = (set(request["scope"]) for request in tokens.requests)
        assert "repository:secured/tiny:pull,push" in push_scopes
        assert pull_scopes == {"repository:secured/tiny:pull"}
        assert all(request["service"] == ["plugd-test-registry"] for request in tokens.requests)
