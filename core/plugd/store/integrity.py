"""Blobs as they are on disk, against what their manifest says and what the store saw of them last.

Every load checks each blob's size, and its recorded size and modification time: a blob changed since (4 KiB
flipped inside a weights file, say) is hashed again, and one that no longer matches its digest, or is missing,
makes the model damaged, which the load error, `/api/show` and `/api/tags` say. A blob seen for the first time is
recorded as it is; its digest was checked when it was written. `plugd verify` hashes every blob.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from plugd.store.blobs import write_atomically
from plugd.store.manifests import Layer, Manifest
from plugd.store.store import Store

# Blob path -> its size and mtime when this process last found it sound: Ollama-format models have a blob per
# tensor, hundreds of them, and each request checks them all.
_verified: dict[Path, dict[str, int]] = {}


def _record_path(store: Store, digest: str) -> Path:
    return store.stat_record_path(digest)


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()


def blob_problem(store: Store, layer: Layer, verify: bool = True, full: bool = False) -> str | None:
    """What is wrong with the blob of `layer`, or None. Without `verify`, a blob changed since it was last seen is
    reported as such instead of hashed (for listings, which must stay quick); with `full`, every blob is hashed,
    changed or not (`plugd verify`)."""
    path = store.blobs.path(layer.digest)
    try:
        seen = path.stat()
    except FileNotFoundError:
        return "is missing"
    if seen.st_size != layer.size:
        return f"holds {seen.st_size} bytes, not {layer.size}"
    now = {"size": seen.st_size, "mtime_ns": seen.st_mtime_ns}
    if not full and _verified.get(path) == now:  # as this process last saw it: no need to read the record
        return None
    record = _record_path(store, layer.digest)
    try:
        recorded = json.loads(record.read_text())
    except (OSError, ValueError):
        recorded = None
    if recorded == now and not full:
        _verified[path] = now
        return None
    if recorded is not None or full:
        if not verify:
            return "changed on disk since it was last verified"
        if _sha256(path) != layer.digest:
            return "no longer matches its sha256 digest"
    record.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(record, json.dumps(now).encode())
    _verified[path] = now
    return None


def damage(store: Store, manifest: Manifest, verify: bool = True, full: bool = False) -> str | None:
    """The first problem with the blobs of `manifest`, naming the blob, or None when all are as written."""
    for layer in (manifest.config, *manifest.layers):
        if (problem := blob_problem(store, layer, verify, full)) is not None:
            return f"blob {layer.digest} ({layer.name or layer.media_type}) {problem}"
    return None
