"""`plugd push`: every blob of a model the registry lacks, then its manifest."""

from __future__ import annotations

import threading
from collections import defaultdict

from plugd.registry.client import RegistryClient, unreachable_as_error
from plugd.registry.parallel import run_all
from plugd.registry.progress import Emit, Progress
from plugd.registry.upload import CHUNK_SIZE, BlobUpload
from plugd.store.names import ModelName
from plugd.store.store import Store

CONNECTIONS = 4


def push_model(store: Store, name: ModelName, *, insecure: bool = False, emit: Emit = lambda _: None,
               cancel: threading.Event | None = None, connections: int = CONNECTIONS,
               chunk_size: int = CHUNK_SIZE) -> None:
    cancel = cancel or threading.Event()
    progress = Progress(emit, "pushing")
    progress.status("retrieving manifest")
    manifest = store.get(name).manifest
    layers = list({layer.digest: layer for layer in (manifest.config, *manifest.layers)}.values())
    sources = mount_sources(store, name)
    mount_from = {layer.digest: sources[layer.digest][0] for layer in layers if sources.get(layer.digest)}
    scopes = [f"repository:{repository}:pull" for repository in sorted(set(mount_from.values()))]
    with unreachable_as_error(name), RegistryClient(name, insecure=insecure, push=True, extra_scopes=scopes) as client:
        uploads = [BlobUpload(client, store, layer, mount_from.get(layer.digest), progress, cancel, chunk_size)
                   for layer in layers]
        run_all([u.run for u in uploads], connections, cancel, "plugd-push")
        progress.status("pushing manifest")
        client.put_manifest(manifest.to_bytes(), manifest.media_type)
    progress.status("success")


def mount_sources(store: Store, name: ModelName) -> dict[str, list[str]]:
    """For each blob, the other repositories of the same registry that local models say hold it: where the
    registry can mount it from instead of receiving it again."""
    sources: dict[str, list[str]] = defaultdict(list)
    for model in store.list():
        repository = f"{model.name.namespace}/{model.name.model}"
        if model.name.host == name.host and (model.name.namespace, model.name.model) != (name.namespace, name.model):
            for digest in sorted(model.manifest.digests()):
                if repository not in sources[digest]:
                    sources[digest].append(repository)
    return sources
