"""The store and create, in process: layout, atomicity, corruption and concurrency."""

import hashlib
import json
import mmap
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest
from safetensors.numpy import load_file

from plugd import plugins
from plugd.store import manifests as mt
from plugd.store.blobs import DigestMismatch, InvalidDigest
from plugd.store.create import CreateError, CreateRequest, create_model
from plugd.store.names import ModelName
from plugd.store.partial import PARTIAL_DIR, RECORD_PREFIX, STALE_AFTER, Part, PartialBlob, remove_stale
from plugd.store.store import PRUNE_GRACE_SECONDS, CorruptModel, ModelNotFound, Store
from plugd.testing.checkpoints import write_checkpoint


@pytest.fixture(scope="module")
def registry():
    return plugins.load()


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "models")


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def upload(store: Store, data: bytes) -> str:
    digest = digest_of(data)
    with store.blobs.writer(digest) as w:
        w.write(data)
        w.commit()
    return digest


def upload_dir(store: Store, directory) -> dict[str, str]:
    return {p.name: upload(store, p.read_bytes()) for p in sorted(directory.iterdir())}


def create(store, registry, name="tiny", **fields):
    statuses = []
    create_model(store, registry, CreateRequest(model=name, **fields), statuses.append)
    return statuses


def test_layout_follows_ollama(store, registry, tiny_qwen3):
    create(store, registry, files=upload_dir(store, tiny_qwen3))
    manifest_path = store.root / "manifests/registry.ollama.ai/library/tiny/latest"
    manifest = json.loads(manifest_path.read_bytes())
    assert manifest["schemaVersion"] == 2
    for layer in [manifest["config"], *manifest["layers"]]:
        blob = store.root / "blobs" / layer["digest"].replace(":", "-")
        assert blob.stat().st_size == layer["size"]
        assert digest_of(blob.read_bytes()) == layer["digest"]
    names = {layer.get("name") for layer in manifest["layers"]}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    weights = next(x for x in manifest["layers"] if x.get("name") == "model.safetensors")
    metadata = json.loads((store.root / "metadata" / (weights["digest"].replace(":", "-") + ".json")).read_bytes())
    assert metadata["tensors"]["model.embed_tokens.weight"] == {"dtype": "F32", "shape": [512, 64]}


def test_config_summarises_the_model(store, registry, tiny_qwen3):
    create(store, registry, files=upload_dir(store, tiny_qwen3))
    config = store.config(store.get(ModelName.parse("tiny")))
    assert config["model_family"] == "qwen3"
    assert config["file_type"] == "F32"
    assert config["parameter_count"] == _count_parameters(tiny_qwen3)
    assert config["capabilities"] == ["completion", "tools", "thinking"]
    assert config["renderer"] == "jinja"
    assert config["context_length"] == 4096


def _count_parameters(directory) -> int:
    return sum(a.size for a in load_file(str(directory / "model.safetensors")).values())


def test_sharded_bf16_checkpoint(store, registry, tmp_path):
    directory = write_checkpoint(tmp_path / "sharded", "qwen3_moe", dtype="bfloat16", shards=3)
    create(store, registry, files=upload_dir(store, directory))
    config = store.config(store.get(ModelName.parse("tiny")))
    assert config["file_type"] == "BF16"
    assert config["model_family"] == "qwen3_moe"


def test_digest_mismatch_leaves_nothing(store):
    data = b"the real bytes"
    wrong = digest_of(b"other bytes")
    with pytest.raises(DigestMismatch), store.blobs.writer(wrong) as w:
        w.write(data)
        w.commit()
    assert not store.blobs.exists(wrong)
    assert not store.blobs.exists(digest_of(data))
    assert list(store.blobs.root.iterdir()) == []


def test_unfinished_write_is_invisible_and_cleaned_at_start(store):
    data = b"x" * 1000
    writer = store.blobs.writer(digest_of(data))
    writer.write(data[:500])
    writer.file.flush()
    assert not store.blobs.exists(digest_of(data))
    assert store.blobs.digests() == set()
    # A daemon killed here leaves the hidden temp file; the next start removes it.
    restarted = Store(store.root)
    restarted.prune()
    assert list(store.blobs.root.iterdir()) == []


@pytest.mark.parametrize("digest", ["sha256:abc", "sha256:" + "G" * 64, "md5:" + "0" * 64, "../" + "0" * 64, ""])
def test_invalid_digests(store, digest):
    with pytest.raises(InvalidDigest):
        store.blobs.exists(digest)


def test_malformed_manifest_is_skipped_and_blocks_pruning(store, registry, tiny_qwen3):
    create(store, registry, files=upload_dir(store, tiny_qwen3))
    orphan = upload(store, b"nobody refers to me")
    broken = store.root / "manifests/registry.ollama.ai/library/broken/latest"
    broken.parent.mkdir(parents=True)
    broken.write_text('{"schemaVersion": 2, "config": ')
    assert [m.name.display() for m in store.list()] == ["tiny:latest"]
    with pytest.raises(CorruptModel, match="broken:latest.*malformed"):
        store.get(ModelName.parse("broken"))
    store.prune()
    assert store.blobs.exists(orphan), "pruning must not guess what an unreadable manifest refers to"
    broken.unlink()
    store.prune()
    assert store.blobs.exists(orphan), "an upload is kept for the create that may follow"
    age(store.blobs.path(orphan), PRUNE_GRACE_SECONDS / 86400 + 0.01)
    store.prune()
    assert not store.blobs.exists(orphan)
    assert store.get(ModelName.parse("tiny"))


@pytest.mark.parametrize(
    "manifest",
    [b"", b"[]", b'{"schemaVersion": 1}', b'{"schemaVersion": 2, "config": {}, "layers": []}',
     b'{"schemaVersion": 2, "config": {"mediaType": "x", "digest": "sha256:00", "size": "big"}, "layers": []}',
     b"\xff\xfe"],
)
def test_malformed_manifest_shapes(store, manifest):
    path = store.root / "manifests/registry.ollama.ai/library/bad/latest"
    path.parent.mkdir(parents=True)
    path.write_bytes(manifest)
    with pytest.raises(CorruptModel):
        store.get(ModelName.parse("bad"))


def test_malformed_config_blob(store, registry, tiny_qwen3):
    create(store, registry, files=upload_dir(store, tiny_qwen3))
    model = store.get(ModelName.parse("tiny"))
    store.blobs.path(model.manifest.config.digest).write_text("{not json")
    with pytest.raises(CorruptModel, match="not valid JSON"):
        store.config(model)


def test_delete_keeps_blobs_other_models_use(store, registry, tiny_qwen3):
    create(store, registry, files=upload_dir(store, tiny_qwen3))
    create(store, registry, name="variant", from_="tiny", system="Be brief.")
    store.delete(ModelName.parse("tiny"))
    with pytest.raises(ModelNotFound):
        store.get(ModelName.parse("tiny"))
    variant = store.get(ModelName.parse("variant"))
    assert all(store.blobs.exists(d) for d in variant.manifest.digests())
    store.delete(ModelName.parse("variant"))
    assert store.blobs.digests() == set()
    assert not any(store.metadata_dir.iterdir())
    assert not any(store.manifests_dir.iterdir())


def test_create_from_model_with_overrides(store, registry, tiny_qwen3):
    create(store, registry, files=upload_dir(store, tiny_qwen3), parameters={"temperature": 0.5, "stop": ["a"]})
    create(store, registry, name="child", from_="tiny", system="Terse.", parameters={"top_k": 7},
           messages=[{"role": "user", "content": "hi"}], license="MIT", capabilities=["completion"])
    child = store.get(ModelName.parse("child"))
    params = json.loads(store.text_blob(child.manifest.layer(mt.PARAMS).digest))
    assert params == {"temperature": 0.5, "stop": ["a"], "top_k": 7}
    assert store.text_blob(child.manifest.layer(mt.SYSTEM).digest) == "Terse."
    assert store.text_blob(child.manifest.layer(mt.LICENSE).digest) == "MIT"
    assert store.config(child)["capabilities"] == ["completion"]
    assert child.manifest.files() == store.get(ModelName.parse("tiny")).manifest.files()


def test_create_errors(store, registry, tiny_qwen3, tmp_path):
    files = upload_dir(store, tiny_qwen3)
    config = json.loads((tiny_qwen3 / "config.json").read_text())
    cases = {
        "neither 'from' nor 'files'": {},
        "not in the store": {"files": {**files, "extra.json": digest_of(b"never uploaded")}},
        "invalid file name": {"files": {**files, "../escape.json": files["config.json"]}},
        "invalid file name 'sub/config.json': must be the name of a file at the top": {
            "files": {**files, "sub/config.json": files["config.json"]}},
        "has no config.json": {"files": {k: v for k, v in files.items() if k != "config.json"}},
        "config.json is not valid JSON": {"files": {**files, "config.json": upload(store, b"{oops")}},
        "config.json has no model_type": {"files": {**files, "config.json": upload(store, b"{}")}},
        "no installed architecture plugin runs model_type 'nowhere'; installed: .*qwen3": {
            "files": {**files, "config.json": upload(store, json.dumps({**config, "model_type": "nowhere"}).encode())}
        },
        "no .safetensors": {"files": {k: v for k, v in files.items() if not k.endswith(".safetensors")}},
        "not a valid safetensors": {"files": {**files, "model.safetensors": upload(store, b"\x08" + b"\0" * 15)}},
        "names weight files that were not given": {
            "files": {**files, "model.safetensors.index.json": upload(store, b'{"weight_map": {"w": "gone.safetensors"}}')}
        },
        "unknown parameter 'mirostat'": {"files": files, "parameters": {"mirostat": 1}},
        "invalid value 'hot' for parameter 'temperature'": {"files": files, "parameters": {"temperature": "hot"}},
        "unknown renderer 'nope'": {"files": files, "renderer": "nope"},
        "unknown capabilities": {"files": files, "capabilities": ["telepathy"]},
    }
    for message, fields in cases.items():
        with pytest.raises(CreateError, match=message):
            create(store, registry, **fields)
    assert store.list() == []


def test_every_way_of_creating_refuses_a_model_no_installed_plugin_runs(store, registry, tiny_qwen3):
    create(store, registry, files=upload_dir(store, tiny_qwen3))
    without_architectures = plugins.load(enabled=())
    for fields in ({"from_": "tiny"}, {"files": upload_dir(store, tiny_qwen3)}):
        with pytest.raises(CreateError, match="no installed architecture plugin runs model_type 'qwen3'; installed: none"):
            create(store, without_architectures, name="child", **fields)
    assert [m.name.display() for m in store.list()] == ["tiny:latest"]


def test_concurrent_creates_of_one_name_end_consistent(store, registry, tiny_qwen3):
    files = upload_dir(store, tiny_qwen3)
    systems = [f"system prompt {i}" for i in range(8)]
    errors = []

    def worker(system):
        try:
            create(store, registry, files=files, system=system)
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in systems]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    model = store.get(ModelName.parse("tiny"))
    assert store.text_blob(model.manifest.layer(mt.SYSTEM).digest) in systems
    assert all(store.blobs.exists(d) for d in model.manifest.digests())
    assert [p.name for p in store.manifests_dir.rglob("*") if p.is_file()] == ["latest"]


@pytest.mark.parametrize("level, bits", [("q4", 4), ("Q8", 8)])
def test_create_quantized(store, registry, tmp_path, level, bits):
    directory = write_checkpoint(tmp_path / "moe", "qwen3_moe")
    statuses = create(store, registry, files=upload_dir(store, directory), quantize=level)
    assert f"quantizing F32 model to {level.upper()}" in statuses
    model = store.get(ModelName.parse("tiny"))
    config = store.config(model)
    assert config["file_type"] == f"Q{bits}"
    assert config["parameter_count"] == _count_parameters(directory)
    weights = model.manifest.files()["model.safetensors"]
    assert weights.size < (directory / "model.safetensors").stat().st_size
    hf_config = json.loads(store.text_blob(model.manifest.files()["config.json"].digest))
    assert hf_config["quantization"]["bits"] == bits


def test_create_quantized_errors(store, registry, tiny_qwen3):
    files = upload_dir(store, tiny_qwen3)
    with pytest.raises(CreateError, match="unsupported quantization 'q4_K_M'"):
        create(store, registry, files=files, quantize="q4_K_M")
    create(store, registry, name="q", files=files, quantize="q4")
    with pytest.raises(CreateError, match="already quantized"):
        create(store, registry, name="qq", from_="q", quantize="q8")


# ---- what pulls leave behind, and pruning ---------------------------------------------------------------------

def pulled_manifest(store: Store, blobs: list[bytes]) -> mt.Manifest:
    """A manifest over `blobs`, of which only the first is in the store (as when a pull stopped after it)."""
    config, *layers = (mt.Layer(mt.CONFIG_MEDIA_TYPE if i == 0 else mt.MODEL_FILE, digest_of(b), len(b))
                       for i, b in enumerate(blobs))
    upload(store, blobs[0])
    return mt.Manifest(config=config, layers=layers)


def age(path, days: float) -> None:
    then = time.time() - days * 24 * 3600
    os.utime(path, (then, then))


def records(store: Store) -> list:
    return sorted((store.blobs.root / PARTIAL_DIR).glob(f"{RECORD_PREFIX}*"))


def test_a_running_pull_keeps_its_blobs_from_prune_and_delete(store, registry, tiny_qwen3):
    create(store, registry, files=upload_dir(store, tiny_qwen3))
    manifest = pulled_manifest(store, [b'{"pulled": 1}', b"weights"])
    shared = store.get(ModelName.parse("tiny")).manifest.config
    manifest = mt.Manifest(config=manifest.config, layers=[*manifest.layers, shared])
    with store.pulling(manifest):
        (record,) = records(store)
        age(record, 30)  # however old, a record a pull holds is live
        Store(store.root).prune()
        store.delete(ModelName.parse("tiny"))
        assert store.blobs.exists(manifest.config.digest) and store.blobs.exists(shared.digest)
        upload(store, b"weights")
        store.put(ModelName.parse("pulled"), manifest)
    assert records(store) == []
    store.prune()
    assert store.blobs.exists(shared.digest)


def test_an_interrupted_pull_is_kept_for_a_while_then_cleaned(store):
    manifest = pulled_manifest(store, [b'{"pulled": 2}', b"weights, half there"])
    partial = store.blobs.root / PARTIAL_DIR / manifest.layers[0].digest.replace(":", "-")
    with pytest.raises(RuntimeError), store.pulling(manifest):
        with PartialBlob(store.blobs, manifest.layers[0].digest, manifest.layers[0].size) as download:
            download.write(b"weights", 0)
            download.save([Part(0, manifest.layers[0].size, 7)])
        raise RuntimeError("the connection went away")
    (record,) = records(store)
    store.prune()
    assert store.blobs.exists(manifest.config.digest) and partial.exists() and record.exists()

    for path in (record, partial, partial.with_name(partial.name + ".parts"), store.blobs.path(manifest.config.digest)):
        age(path, STALE_AFTER / 86400 + 1)
    store.prune()
    assert not store.blobs.exists(manifest.config.digest)
    assert list((store.blobs.root / PARTIAL_DIR).iterdir()) == []


def test_stale_partials_are_removed_unless_a_download_holds_them(store):
    held_data, left_data = b"downloading now", b"abandoned"
    held_digest, left_digest = digest_of(held_data), digest_of(left_data)
    orphan = store.blobs.root / PARTIAL_DIR / ("sha256-" + "0" * 64 + ".parts")
    with PartialBlob(store.blobs, held_digest, len(held_data)) as held:
        with PartialBlob(store.blobs, left_digest, len(left_data)) as left:
            left.save([Part(0, len(left_data), 0)])
        orphan.write_text("{}")
        for path in (held.path, left.path, left.parts_path):
            age(path, STALE_AFTER / 86400 + 1)
        fresh = PartialBlob(store.blobs, digest_of(b"fresh"), 5)
        with fresh:
            pass
        store.prune()
        assert held.path.exists() and fresh.path.exists()
        assert not left.path.exists() and not left.parts_path.exists() and not orphan.exists()
        held.write(held_data, 0)
        assert held.publish() == store.blobs.path(held_digest)


def test_a_download_that_opens_a_partial_as_it_is_pruned_starts_a_new_file(store):
    data = b"abandoned, then resumed"
    first = PartialBlob(store.blobs, digest_of(data), len(data))
    with first:
        first.write(b"abandoned", 0)
    age(first.path, STALE_AFTER / 86400 + 1)
    opened = os.open(first.path, os.O_RDONLY)  # another process is between its open and its lock
    try:
        remove_stale(store.blobs)
        assert not first.path.exists()
        with PartialBlob(store.blobs, digest_of(data), len(data)) as second:
            assert os.fstat(second.fd).st_ino != os.fstat(opened).st_ino and second.path.exists()
    finally:
        os.close(opened)


def test_a_partial_blob_takes_aligned_and_unaligned_writes(store):
    """Whole blocks from a page-aligned buffer may go around the page cache (direct I/O), the rest through it
    (an unaligned offset, size or buffer); the file holds every byte either way."""
    block = 4096
    aligned = mmap.mmap(-1, 4 * block)
    aligned.write(bytes(range(256)) * (4 * block // 256))
    tail, unaligned = b"tail, an odd size", memoryview(bytearray(b"x" * (2 * block + 1)))[1:]
    data = bytes(aligned) + bytes(unaligned) + tail
    with PartialBlob(store.blobs, digest_of(data), len(data)) as download:
        download.write(memoryview(aligned), 0)
        download.write(unaligned, 4 * block)  # aligned offset and size, unaligned buffer
        download.write(tail, 6 * block)
        download.write(memoryview(aligned)[:block], 0)  # rewritten in place, as a retried range is
        assert os.pread(download.fd, len(data), 0) == data
        download.publish()
    assert store.blobs.path(digest_of(data)).read_bytes() == data


def test_a_second_daemon_on_the_same_store_exits_naming_the_first(plugd_server, tmp_path):
    """It would prune the first one's uploads in progress; it stops before touching the store."""
    upload = plugd_server.models / "blobs" / ("sha256-" + "1" * 64)
    upload.parent.mkdir(parents=True, exist_ok=True)
    upload.write_bytes(b"uploaded, its create still to come")
    second = subprocess.run([sys.executable, "-m", "plugd", "serve"], capture_output=True, text=True, timeout=60,
                            env={**plugd_server.env, "PLUGD_HOST": "127.0.0.1:0"})
    assert second.returncode == 1
    assert second.stderr.strip() == (
        f"Error: the model store {plugd_server.models} is in use by another plugd serve (pid "
        f"{plugd_server.process.pid}, listening on 127.0.0.1:{plugd_server.port}); stop it first, or give this one "
        "PLUGD_MODELS of its own")
    assert upload.exists()
    assert httpx.get(f"{plugd_server.url}/api/tags").status_code == 200
