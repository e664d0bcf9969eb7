"""End to end: `plugd pull hf.co/ORG/REPO[:REVISION]` into a real daemon from a loopback server that speaks the
Hugging Face Hub's HTTP API (plugd.hub.testing), reached through HF_ENDPOINT. Float, MLX-quantized (written by
mlx-lm's convert, as mlx-community publishes them) and sharded checkpoints answer exactly as the same checkpoints
created from their directories; a download cut mid-file resumes; files already in the Hugging Face cache are not
downloaded again; each refusal is clear and leaves no model behind."""

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import ollama
import pytest
from mlx_lm import convert

from plugd.hub.files import HubFile
from plugd.hub.follow import Follower
from plugd.hub.importing import import_cached
from plugd.hub.testing import HubServer
from plugd.registry.errors import BlobCorrupt
from plugd.store.blobs import BlobStore
from plugd.store.model_files import is_model_file
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.embeddings import write_embedding_checkpoint
from plugd.testing.server import LiveServer

GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 24}
BIG = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4, "head_dim": 64}  # ~18 MB of weights
CHUNK = 10 * 1024 * 1024  # huggingface_hub writes a download in chunks of this size; a resume starts after the last


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    dirs = {
        "float": write_checkpoint(root / "float", "qwen3", seed=0),
        "v2": write_checkpoint(root / "v2", "qwen3", seed=1),
        "sharded": write_checkpoint(root / "sharded", "qwen3", seed=2, shards=3),
        "cached": write_checkpoint(root / "cached", "qwen3", seed=5),
        "big": write_checkpoint(root / "big", "qwen3", seed=4, overrides=BIG),
        "embedding": write_embedding_checkpoint(root / "embedding", "qwen3", seed=7, pooling="mean", dense=[24]),
    }
    # What else an older repository holds: a model card, and the same weights as a PyTorch pickle.
    (dirs["float"] / "README.md").write_text("---\nlicense: mit\n---\n# Tiny Qwen3\n")
    (dirs["float"] / "pytorch_model.bin").write_bytes(os.urandom(4096))
    convert(str(write_checkpoint(root / "float-for-mlx", "qwen3", seed=3)), mlx_path=str(root / "mlx-4bit"),
            quantize=True, q_bits=4, q_group_size=64)
    dirs["mlx"] = root / "mlx-4bit"
    gguf = dirs["gguf"] = root / "gguf"
    gguf.mkdir()
    (gguf / "tiny-Q4_K_M.gguf").write_bytes(b"GGUF" + os.urandom(4096))
    (gguf / "README.md").write_text("# GGUF quantizations\n")
    torch = dirs["torch"] = root / "torch"
    torch.mkdir()
    (torch / "config.json").write_text((dirs["float"] / "config.json").read_text())
    (torch / "pytorch_model.bin").write_bytes(os.urandom(4096))
    broken = dirs["broken"] = write_checkpoint(root / "broken", "qwen3", seed=6)
    config = json.loads((broken / "config.json").read_text())
    del config["model_type"]
    (broken / "config.json").write_text(json.dumps(config))
    return dirs


@pytest.fixture(scope="module")
def hub(checkpoints):
    with HubServer(tokens={"hf_granted", "hf_other"}) as hub:
        hub.add("Plugd-Test/Tiny-Qwen3", checkpoints["float"])
        hub.add("Plugd-Test/Tiny-Qwen3", checkpoints["v2"], revision="v2")
        hub.add("mlx-community/Tiny-Qwen3-4bit", checkpoints["mlx"])
        for repo in ("sharded", "cached", "big", "gguf", "torch", "broken", "embedding"):
            hub.add(f"Plugd-Test/Tiny-{repo.title()}", checkpoints[repo])
        hub.add("Plugd-Test/Tiny-Gated", checkpoints["float"], gated_for={"hf_granted"})
        yield hub


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    return tmp_path_factory.mktemp("hf-home")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, hub, hf_home):
    server = LiveServer(tmp_path_factory.mktemp("daemon") / "models",
                        env={"HF_ENDPOINT": hub.url, "HF_HOME": str(hf_home), "HF_TOKEN": "", "HF_HUB_OFFLINE": "0"})
    yield server
    server.stop()


@contextmanager
def token_file(hf_home, token):
    """The token `hf auth login` keeps for the daemon's user."""
    (hf_home / "token").write_text(token)
    try:
        yield
    finally:
        (hf_home / "token").unlink()


def uploaded_by_create(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if is_model_file(p.name))


def manifest(server, name):
    host, namespace, rest = name.split("/")
    model, tag = rest.split(":") if ":" in rest else (rest, "latest")
    return json.loads((server.models / "manifests" / host / namespace / model / tag).read_text())


def model_files(server, name):
    return {layer["name"]: layer["digest"] for layer in manifest(server, name)["layers"] if layer.get("name")}


@pytest.mark.parametrize("repo, checkpoint, quantization", [("Plugd-Test/Tiny-Qwen3", "float", "F32"),
                                                            ("mlx-community/Tiny-Qwen3-4bit", "mlx", "Q4"),
                                                            ("Plugd-Test/Tiny-Sharded", "sharded", "F32")])
def test_a_pulled_model_is_the_model_created_from_its_directory(daemon, hub, hf_home, checkpoints, repo, checkpoint,
                                                                 quantization):
    directory, name = checkpoints[checkpoint], f"hf.co/{repo}".lower()
    hub.log.clear()
    pull = daemon.cli("pull", f"hf.co/{repo}")
    assert pull.returncode == 0, pull.stderr + daemon.log()
    lines = pull.stderr.splitlines()
    assert lines[0] == f"resolving {repo} at main" and lines[-1] == "success"
    wanted = uploaded_by_create(directory)
    for file in wanted:
        assert f"pulling {file}: 100% ▕{'█' * 25}▏" in pull.stderr
    assert sorted(r.file for r in hub.downloads()) == wanted  # no model card, no pickle
    assert "pytorch_model.bin" not in pull.stderr

    created = f"local-{checkpoint}"
    daemon.cli("create", created, "--from", str(directory), check=True)
    assert model_files(daemon, name) == model_files(daemon, f"registry.ollama.ai/library/{created}")
    for file, digest in model_files(daemon, name).items():
        if file.endswith(".safetensors"):  # the store's blob is the Hugging Face cache's, not a copy of it
            cached = hf_home / "hub" / f"models--{repo.replace('/', '--')}" / "blobs" / digest.removeprefix("sha256:")
            assert (daemon.models / "blobs" / digest.replace(":", "-")).stat().st_ino == cached.stat().st_ino

    client = ollama.Client(host=daemon.url)
    pulled, local = client.show(name), client.show(created)
    assert pulled.modelinfo["general.source"] == f"hf.co/{repo}"
    assert pulled.modelinfo["general.source_revision"] == "main"
    assert pulled.modelinfo["general.source_commit"] == hub.repos[repo].branches["main"]
    assert (pulled.details, pulled.capabilities, pulled.template) == (local.details, local.capabilities, local.template)
    assert pulled.details.quantization_level == quantization
    ours = client.generate(model=name, prompt="Once upon a time", options=GREEDY)
    theirs = client.generate(model=created, prompt="Once upon a time", options=GREEDY)
    assert ours.eval_count == GREEDY["num_predict"] and ours.response
    assert ours.response == theirs.response


def test_an_embedding_model_comes_with_its_module_folders(daemon, hub, checkpoints):
    hub.log.clear()
    pull = daemon.cli("pull", "hf.co/Plugd-Test/Tiny-Embedding")
    assert pull.returncode == 0, pull.stderr + daemon.log()
    assert {"modules.json", "1_Pooling/config.json", "2_Dense/config.json", "2_Dense/model.safetensors",
            "model.safetensors"} <= {r.file for r in hub.downloads()}
    daemon.cli("create", "local-embedding", "--from", str(checkpoints["embedding"]), check=True)
    client = ollama.Client(host=daemon.url)
    name = "hf.co/plugd-test/tiny-embedding"
    assert client.show(name).capabilities == ["embedding"]
    assert model_files(daemon, name) == model_files(daemon, "registry.ollama.ai/library/local-embedding")
    pulled = client.embed(model=name, input=["one", "two words"]).embeddings
    assert pulled == client.embed(model="local-embedding", input=["one", "two words"]).embeddings
    assert len(pulled[0]) == 24


def test_a_revision_is_pinned(daemon, hub, checkpoints):
    client = ollama.Client(host=daemon.url)
    assert client.pull("huggingface.co/Plugd-Test/Tiny-Qwen3:v2").status == "success"
    branches = hub.repos["Plugd-Test/Tiny-Qwen3"].branches
    info = client.show("hf.co/plugd-test/tiny-qwen3:v2").modelinfo
    assert (info["general.source_revision"], info["general.source_commit"]) == ("v2", branches["v2"])
    shown = daemon.cli("show", "hf.co/plugd-test/tiny-qwen3:v2", check=True).stdout
    assert re.search(rf"\n    source +hf\.co/Plugd-Test/Tiny-Qwen3 at {branches['v2']}\n", shown), shown
    files = model_files(daemon, "hf.co/plugd-test/tiny-qwen3:v2")
    assert files["model.safetensors"] == "sha256:" + sha256(checkpoints["v2"] / "model.safetensors")

    commit = branches["main"]
    assert client.pull(f"hf.co/Plugd-Test/Tiny-Qwen3:{commit}").status == "success"
    assert client.show(f"hf.co/plugd-test/tiny-qwen3:{commit}").modelinfo["general.source_commit"] == commit
    assert model_files(daemon, f"hf.co/plugd-test/tiny-qwen3:{commit}")["model.safetensors"] == (
        "sha256:" + sha256(checkpoints["float"] / "model.safetensors"))


def test_a_download_cut_mid_file_resumes(daemon, hub, checkpoints):
    weights = checkpoints["big"] / "model.safetensors"
    assert weights.stat().st_size > 15_000_000
    hub.cut("model.safetensors", after=15_000_000)
    hub.log.clear()
    assert ollama.Client(host=daemon.url).pull("hf.co/Plugd-Test/Tiny-Big").status == "success"
    first, resumed = [r for r in hub.downloads() if r.file == "model.safetensors"]
    assert first.range is None and resumed.range == f"bytes={CHUNK}-" and resumed.status == 206
    assert model_files(daemon, "hf.co/plugd-test/tiny-big")["model.safetensors"] == "sha256:" + sha256(weights)


def test_files_in_the_hugging_face_cache_are_not_downloaded_again(daemon, hub, hf_home, checkpoints):
    from huggingface_hub import snapshot_download  # as any other tool of the user's fills the cache

    snapshot_download("Plugd-Test/Tiny-Cached", cache_dir=hf_home / "hub", endpoint=hub.url, token=False)
    hub.log.clear()
    pull = daemon.cli("pull", "hf.co/Plugd-Test/Tiny-Cached")
    assert pull.returncode == 0, pull.stderr
    assert hub.downloads() == []
    commit = hub.repos["Plugd-Test/Tiny-Cached"].branches["main"]
    api = "/api/models/Plugd-Test/Tiny-Cached"
    assert [r.path for r in hub.log if r.path != "/api/agent-harnesses"] == [f"{api}/revision/main", f"{api}/tree/{commit}"]
    for file in uploaded_by_create(checkpoints["cached"]):
        assert f"pulling {file}: 100% ▕{'█' * 25}▏" in pull.stderr


def failure(daemon, model):
    response = httpx.post(f"{daemon.url}/api/pull", json={"model": model, "stream": False}, timeout=60)
    return response.status_code, response.json()["error"]


def test_refusals_a_user_can_act_on(daemon, hub, hf_home):
    hub.log.clear()
    cli = daemon.cli("pull", "hf.co/Plugd-Test/Nothing")
    assert cli.returncode == 1
    assert cli.stderr.splitlines()[-1] == (
        f"Error: no repository Plugd-Test/Nothing on the Hugging Face Hub ({hub.url}): check the name, whose case "
        "counts; for a private repository, give the daemon a token: HF_TOKEN in its environment, or `hf auth login` "
        "as its user (HF_HOME decides where that is kept)")
    assert failure(daemon, "hf.co/Plugd-Test/Nothing")[0] == 404

    status, error = failure(daemon, "hf.co/Plugd-Test/Tiny-Qwen3:v9")
    assert status == 404 and error.startswith("hf.co/Plugd-Test/Tiny-Qwen3 has no revision 'v9'")

    status, error = failure(daemon, "hf.co/Plugd-Test/Tiny-Gguf")
    assert status == 400 and error.startswith("hf.co/Plugd-Test/Tiny-Gguf holds GGUF weights, the llama.cpp format")
    status, error = failure(daemon, "hf.co/Plugd-Test/Tiny-Torch")
    assert status == 400 and error.startswith("hf.co/Plugd-Test/Tiny-Torch holds only PyTorch weights")
    assert hub.downloads() == []  # each was refused before a file was fetched

    status, error = failure(daemon, "hf.co/Plugd-Test/Tiny-Broken")
    assert status == 400 and error.startswith("hf.co/Plugd-Test/Tiny-Broken cannot be made into a model: ")
    assert "model_type" in error

    response = httpx.post(f"{daemon.url}/api/push", json={"model": "hf.co/Plugd-Test/Tiny-Qwen3", "stream": False})
    assert response.status_code == 400 and "does not push to the Hugging Face Hub" in response.json()["error"]
    for refused in ("nothing", "tiny-gguf", "tiny-torch", "tiny-broken"):
        assert not (daemon.models / "manifests" / "hf.co" / "plugd-test" / refused).exists()


def test_a_gated_repository_needs_a_token_with_access(daemon, hub, hf_home):
    gated = "hf.co/Plugd-Test/Tiny-Gated"
    hub.log.clear()
    status, error = failure(daemon, gated)
    assert status == 401 and error.startswith(f"{gated} is a gated repository: ask for access at "
                                              f"{hub.url}/Plugd-Test/Tiny-Gated, then give the daemon a token")
    with token_file(hf_home, "hf_wrong"):
        status, error = failure(daemon, gated)
        assert status == 401 and "refused the daemon's token as invalid" in error
    with token_file(hf_home, "hf_other"):
        status, error = failure(daemon, gated)
        assert status == 403 and "the daemon's token has not been granted access" in error
    assert not (daemon.models / "manifests" / "hf.co" / "plugd-test" / "tiny-gated").exists()
    client = ollama.Client(host=daemon.url)
    with token_file(hf_home, "hf_granted"):
        assert client.pull(gated).status == "success"
    asked_for_files = [r for r in hub.log if r.method == "HEAD" and "/resolve/" in r.path]
    assert {(r.token, r.status) for r in asked_for_files} == {(None, 401), ("hf_other", 403), ("hf_granted", 200),
                                                              ("hf_granted", 302)}


def cached_file(directory: Path, data: bytes) -> tuple[Path, HubFile]:
    path = directory / "model.safetensors"
    path.write_bytes(data)
    return path, HubFile("model.safetensors", len(data), "0" * 40, hashlib.sha256(data).hexdigest())


def test_a_cached_file_becomes_a_blob_by_a_hard_link(tmp_path):
    blobs = BlobStore(tmp_path / "blobs")
    path, file = cached_file(tmp_path, b"weights" * 1000)
    digest = import_cached(blobs, path, file)
    assert digest == f"sha256:{file.sha256}" and blobs.path(digest).stat().st_ino == path.stat().st_ino


def test_a_cached_file_on_another_file_system_is_copied(tmp_path):
    if not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs a second file system: /dev/shm")
    blobs = BlobStore(tmp_path / "blobs")
    other_fs = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        path, file = cached_file(other_fs, b"other weights" * 1000)
        digest = import_cached(blobs, path, file)
        assert blobs.path(digest).read_bytes() == path.read_bytes()
        assert blobs.path(digest).stat().st_ino != path.stat().st_ino
    finally:
        shutil.rmtree(other_fs)


def test_a_cached_file_that_is_not_what_the_hub_lists_is_refused(tmp_path):
    blobs = BlobStore(tmp_path / "blobs")
    path, file = cached_file(tmp_path, b"weights" * 1000)
    path.write_bytes(b"garbage" * 1000)  # same size: huggingface_hub's own check would pass it
    with pytest.raises(BlobCorrupt, match="is not what the Hub lists"):
        import_cached(blobs, path, file)
    assert blobs.digests() == set()


def write_as_huggingface_hub_does(blobs_dir: Path, data: bytes, sha: str, rewrite: bytes | None = None) -> Path:
    """A download into `<sha256>.<id>.incomplete` in chunks, renamed into the cache's `blobs/<sha256>` at the end;
    `rewrite` replaces its first bytes once all are written (as a download that starts over would)."""
    partial = blobs_dir / f"{sha}.0a1b2c3d.incomplete"
    with partial.open("wb") as f:
        for start in range(0, len(data), 1 << 16):
            f.write(data[start:start + (1 << 16)])
            f.flush()
            time.sleep(0.002)
        if rewrite is not None:
            f.seek(0)
            f.write(rewrite)
    time.sleep(0.1)  # the follower has read every byte before the rename
    return partial.rename(blobs_dir / sha)


def test_a_file_is_hashed_as_it_downloads(tmp_path):
    data = os.urandom(3 << 20)
    sha = hashlib.sha256(data).hexdigest()
    with Follower(tmp_path, sha) as follower:
        final = write_as_huggingface_hub_does(tmp_path, data, sha)
        assert follower.offset == len(data)  # read behind the writer, not after it
        assert follower.digest(final) == sha


def test_a_file_the_follower_did_not_see_is_hashed_after_its_download(tmp_path):
    blobs = BlobStore(tmp_path / "blobs")
    path, file = cached_file(tmp_path, b"weights" * 1000)
    with Follower(tmp_path / "elsewhere", file.sha256) as follower:
        assert follower.digest(path) is None
        assert import_cached(blobs, path, file, follower) == f"sha256:{file.sha256}"


def test_bytes_rewritten_behind_the_follower_are_hashed_again_not_refused(tmp_path):
    data = os.urandom(1 << 20)
    sha = hashlib.sha256(data).hexdigest()
    blobs = BlobStore(tmp_path / "store")
    with Follower(tmp_path, sha) as follower:
        final = write_as_huggingface_hub_does(tmp_path, b"\0" * 4096 + data[4096:], sha, rewrite=data[:4096])
        assert follower.digest(final) != sha
        file = HubFile("model.safetensors", len(data), "0" * 40, sha)
        assert import_cached(blobs, final, file, follower) == f"sha256:{sha}"
