"""Pull and push in process against a real registry (Debian's docker-registry on loopback), through a proxy that
cuts connections and corrupts blobs: ranged parts, resumption, verification, disk full, chunked uploads."""

import os
import threading
import time

import pytest

from plugd.registry import download, upload
from plugd.registry.download import Tuning
from plugd.registry.errors import BlobCorrupt, DiskFull, RegistryUnreachable
from plugd.registry.pull import pull_model
from plugd.registry.push import push_model
from plugd.registry.testing import DockerRegistry, Front, store_with_model
from plugd.store.manifests import MODEL_FILE
from plugd.store.names import ModelName
from plugd.store.partial import PARTIAL_DIR
from plugd.store.store import Store

PART = 128 << 10


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with DockerRegistry(tmp_path_factory.mktemp("registry")) as registry:
        yield registry


@pytest.fixture(scope="module")
def source(registry, tmp_path_factory):
    """A store whose model has been pushed to the registry as test/tiny:v1."""
    name = ModelName.parse(f"{registry.address}/test/tiny:v1")
    store = store_with_model(tmp_path_factory.mktemp("source") / "models", name)
    push_model(store, name)
    return store, name


@pytest.fixture
def front(registry):
    with Front(registry.url) as front:
        yield front


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(download, "BACKOFF", 0.01)
    monkeypatch.setattr(upload, "BACKOFF", 0.01)


def via(front, name):
    return ModelName.parse(f"{front.address}/{name.namespace}/{name.model}:{name.tag}")


def weights(store, name):
    return store.get(name).manifest.files()["model.safetensors"]


def assert_pulled_intact(target, source_store, name, front_name):
    pulled, original = target.get(front_name).manifest, source_store.get(name).manifest
    assert pulled == original
    for digest in pulled.digests():
        assert target.blobs.path(digest).read_bytes() == source_store.blobs.path(digest).read_bytes()
    assert not list((target.blobs.root / PARTIAL_DIR).glob("sha256-*[!s]"))  # no download left behind


def test_parallel_ranged_parts_cover_each_blob(source, front, tmp_path):
    store, name = source
    target = Store(tmp_path / "models")
    pull_model(target, via(front, name), tuning=Tuning(part_size=PART), connections=4)
    layer = weights(store, name)
    ranges = sorted(tuple(int(x) for x in r.removeprefix("bytes=").split("-"))
                    for method, path, r in front.blob_gets() if layer.digest in path)
    assert len(ranges) == -(-layer.size // PART) > 2
    assert ranges[0][0] == 0 and ranges[-1][1] == layer.size - 1
    assert all(b[0] == a[1] + 1 for a, b in zip(ranges, ranges[1:]))
    assert_pulled_intact(target, store, name, via(front, name))


def test_a_slow_connection_hands_its_second_half_to_idle_ones(source, front, tmp_path):
    store, name = source
    layer = weights(store, name)

    def slowly(handler, offset, chunk):
        if layer.digest not in handler.path:
            return chunk
        for start in range(0, len(chunk), 16 << 10):
            handler.wfile.write(chunk[start:start + (16 << 10)])
            handler.wfile.flush()
            time.sleep(0.03)
        return b""

    front.body_filter = slowly
    target = Store(tmp_path / "models")
    tuning = Tuning(split_after=0.2, split_below=2e6, min_split=32 << 10)
    pull_model(target, via(front, name), tuning=tuning, connections=4)
    starts = sorted(int(r.removeprefix("bytes=").split("-")[0]) for _, path, r in front.blob_gets() if layer.digest in path)
    assert starts[0] == 0 and len(starts) >= 3
    assert_pulled_intact(target, store, name, via(front, name))


def cut_once(front, digest, after):
    """Drop the connection of the first download of `digest` after `after` bytes; count every byte served."""
    served, cuts = [0], [0]

    def body_filter(handler, offset, chunk):
        if digest not in handler.path:
            return chunk
        if cuts[0] == 0 and offset + len(chunk) > after:
            cuts[0] += 1
            served[0] += after - offset
            handler.wfile.write(chunk[: after - offset])
            return None
        served[0] += len(chunk)
        return chunk

    front.body_filter = body_filter
    return served


def test_a_cut_connection_continues_where_it_stopped(source, front, tmp_path):
    store, name = source
    layer = weights(store, name)
    served = cut_once(front, layer.digest, after=layer.size // 3)
    target = Store(tmp_path / "models")
    pull_model(target, via(front, name))
    gets = [r for _, path, r in front.blob_gets() if layer.digest in path]
    assert gets == [f"bytes=0-{layer.size - 1}", f"bytes={layer.size // 3}-{layer.size - 1}"]
    assert served[0] == layer.size  # nothing fetched twice
    assert_pulled_intact(target, store, name, via(front, name))


def test_an_interrupted_pull_resumes_on_the_next_pull(source, front, tmp_path):
    store, name = source
    layer = weights(store, name)
    cut_at = layer.size // 2
    served = cut_once(front, layer.digest, after=cut_at)

    def unavailable_after_the_cut(handler):
        if layer.digest in handler.path and handler.command == "GET" and served[0] >= cut_at:
            handler.reply(503)
            return True
        return False

    front.rules.append(unavailable_after_the_cut)
    target = Store(tmp_path / "models")
    with pytest.raises(RegistryUnreachable, match=layer.digest):
        pull_model(target, via(front, name))
    assert target.list() == [] and not target.blobs.exists(layer.digest)
    partial = target.blobs.root / PARTIAL_DIR / layer.digest.replace(":", "-")
    assert partial.stat().st_size == cut_at
    finished = target.blobs.digests()
    assert finished and layer.digest not in finished

    Store(target.root).prune()  # as a daemon restarting does: the pull's finished blobs and partial stay
    assert target.blobs.digests() == finished and partial.stat().st_size == cut_at
    front.rules.clear()
    front.log.clear()
    pull_model(target, via(front, name))
    assert [r for _, path, r in front.blob_gets()] == [f"bytes={cut_at}-{layer.size - 1}"]
    assert served[0] == layer.size
    assert_pulled_intact(target, store, name, via(front, name))


def test_a_corrupted_blob_is_detected_and_discarded(source, front, tmp_path):
    store, name = source
    layer = weights(store, name)

    def flip_a_byte(handler, offset, chunk):
        if layer.digest in handler.path and offset == 0:
            return bytes([chunk[0] ^ 0xFF]) + chunk[1:]
        return chunk

    front.body_filter = flip_a_byte
    target = Store(tmp_path / "models")
    with pytest.raises(BlobCorrupt, match=f"blob {layer.digest} failed verification.*discarded"):
        pull_model(target, via(front, name))
    assert target.list() == [] and not target.blobs.exists(layer.digest)
    assert not (target.blobs.root / PARTIAL_DIR / layer.digest.replace(":", "-")).exists()

    front.body_filter = None
    pull_model(target, via(front, name))
    assert_pulled_intact(target, store, name, via(front, name))


def test_disk_full_leaves_nothing_visible(source, front, tmp_path):
    store, name = source
    layer = weights(store, name)
    target = Store(tmp_path / "models")
    partial_dir = target.blobs.root / PARTIAL_DIR
    partial_dir.mkdir()
    os.symlink("/dev/full", partial_dir / layer.digest.replace(":", "-"))  # every write there fails with ENOSPC
    with pytest.raises(DiskFull, match=f"disk full while pulling blob {layer.digest}"):
        pull_model(target, via(front, name))
    assert target.list() == []
    assert not target.blobs.exists(layer.digest)


def test_cancelling_stops_the_pull_and_keeps_what_it_had(source, front, tmp_path):
    store, name = source
    layer = weights(store, name)
    cancel, responses = threading.Event(), []

    def cancel_midway(handler, offset, chunk):
        if layer.digest in handler.path and offset == 0:
            responses.append(offset)
            if len(responses) == 2:
                cancel.set()  # as the daemon does when the client goes away
        return chunk

    front.body_filter = cancel_midway
    target = Store(tmp_path / "models")
    with pytest.raises(Exception, match="cancelled"):
        pull_model(target, via(front, name), cancel=cancel, tuning=Tuning(part_size=PART), connections=1)
    assert target.list() == []
    parts_file = target.blobs.root / PARTIAL_DIR / (layer.digest.replace(":", "-") + ".parts")
    assert parts_file.exists()


def test_push_sends_chunks_to_each_location_the_registry_gives(source, front, tmp_path):
    store, name = source
    pushed = ModelName.parse(f"{front.address}/chunked/tiny:v1")
    store.copy(name, pushed)
    push_model(store, pushed, chunk_size=PART)
    layer = weights(store, name)
    patches = [path for method, path, _ in front.log if method == "PATCH"]
    weight_chunks = -(-layer.size // PART)
    assert len(patches) >= weight_chunks > 2
    assert len(set(patches)) == len(patches)  # each chunk went to the Location of the previous answer
    target = Store(tmp_path / "models")
    pull_model(target, pushed)
    assert_pulled_intact(target, store, pushed, pushed)


def test_push_resumes_an_interrupted_chunk(source, front, tmp_path):
    store, name = source
    pushed = ModelName.parse(f"{front.address}/resumed/tiny:v1")
    store.copy(name, pushed)
    cut = []

    def drop_the_first_weights_chunk(handler):
        length = int(handler.headers.get("Content-Length") or 0)
        if handler.command == "PATCH" and length > 100_000 and not cut:
            cut.append(handler.rfile.read(length // 2))
            handler.close_connection = True
            handler.connection.shutdown(2)
            return True
        return False

    front.rules.append(drop_the_first_weights_chunk)
    push_model(store, pushed)
    assert cut and [m for m, _, _ in front.log].count("GET") >= 1  # asked where the upload stood
    target = Store(tmp_path / "models")
    pull_model(target, pushed)
    assert_pulled_intact(target, store, pushed, pushed)


def test_model_files_arrive_under_their_names(source, tmp_path):
    store, name = source
    target = Store(tmp_path / "models")
    pull_model(target, name)
    files = target.get(name).manifest.files()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    assert all(layer.media_type == MODEL_FILE for layer in files.values())
