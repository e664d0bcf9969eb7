"""`plugd pull`: a model's manifest by tag, then every blob it lists that the store lacks, then the manifest.

The manifest becomes visible only after all its blobs are in the store, each verified against its digest.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import PurePosixPath

from plugd.registry.client import RegistryClient, unreachable_as_error
from plugd.registry.download import BlobDownload, Connections, Tuning
from plugd.registry.errors import DiskFull, RegistryError, UnsupportedFormat
from plugd.registry.parallel import run_all
from plugd.registry.progress import Emit, Progress
from plugd.store.blobs import InvalidDigest, parse_digest
from plugd.store.manifests import GGUF_WEIGHTS, Layer, Manifest
from plugd.store.names import ModelName
from plugd.store.partial import bytes_on_disk
from plugd.store.store import Store

CONNECTIONS = 4
BLOBS_AT_ONCE = 16


def pull_model(store: Store, name: ModelName, *, insecure: bool = False, emit: Emit = lambda _: None,
               cancel: threading.Event | None = None, connections: int = CONNECTIONS, tuning: Tuning = Tuning()) -> None:
    cancel = cancel or threading.Event()
    progress = Progress(emit, "pulling")
    progress.status("pulling manifest")
    with unreachable_as_error(name), RegistryClient(name, insecure=insecure) as client:
        manifest = client.get_manifest()
        layers = _layers(manifest, name)
        with store.pulling(manifest):
            missing = [layer for layer in layers if not store.blobs.exists(layer.digest)]
            for layer in layers:
                if layer not in missing:
                    progress.layer(layer.digest, layer.size, layer.size)
            _ensure_space(store, name, missing)
            with Connections(connections) as parts:
                downloads = [BlobDownload(client, store, layer, parts, progress, cancel, tuning) for layer in missing]
                # A blob's thread mostly waits for its parts and hashes them; many wait while `connections` fetch.
                run_all([d.run for d in downloads], BLOBS_AT_ONCE, cancel, "plugd-pull")
            progress.status("verifying sha256 digest")
            progress.status("writing manifest")
            store.put(name, manifest)
    progress.status("success")


def _layers(manifest: Manifest, name: ModelName) -> list[Layer]:
    """The config and layers, each digest once; a digest that is not sha256, a negative size or a file name outside
    the model directory is refused, and so is a model in Ollama's GGUF format, before any of it is downloaded."""
    if any(layer.media_type == GGUF_WEIGHTS for layer in manifest.layers):
        raise UnsupportedFormat(
            f"{name} is a GGUF model, the llama.cpp format Ollama runs; plugd runs safetensors models on MLX. Instead, "
            "pull a tag of it in Ollama's MLX (safetensors) format where one is published (e.g. a tag ending in -mlx), "
            "pull its safetensors checkpoint from the Hugging Face Hub (plugd pull hf.co/ORG/REPO), or create it from a "
            "Hugging Face model directory (plugd create NAME --from DIR)")
    for file in manifest.files():
        path = PurePosixPath(file)
        if path.is_absolute() or ".." in path.parts or "\\" in file or str(path) != file:
            raise RegistryError(f"the manifest of {name} names a file outside the model directory: {file!r}")
    layers: dict[str, Layer] = {}
    for layer in (manifest.config, *manifest.layers):
        try:
            parse_digest(layer.digest)
        except InvalidDigest as exc:
            raise RegistryError(f"the manifest of {name} names an unusable blob: {exc}") from None
        if layer.size < 0:
            raise RegistryError(f"the manifest of {name} gives blob {layer.digest} a negative size")
        layers.setdefault(layer.digest, layer)
    return list(layers.values())


def _ensure_space(store: Store, name: ModelName, missing: list[Layer]) -> None:
    needed = sum(max(0, layer.size - bytes_on_disk(store.blobs, layer.digest)) for layer in missing)
    free = shutil.disk_usage(store.blobs.root).free
    if needed > free:
        raise DiskFull(f"not enough disk space to pull {name}: it needs {needed / 1e9:.2f} GB more, "
                       f"{free / 1e9:.2f} GB are free in {store.root}")
