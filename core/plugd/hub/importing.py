"""Files of the Hugging Face cache made blobs of the store: hard-linked where both share a file system, copied
otherwise, and either way checked against their sha256 before they become visible."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from plugd.hub.files import HubFile
from plugd.hub.follow import Follower
from plugd.registry.errors import BlobCorrupt
from plugd.store.blobs import BlobStore, DigestMismatch

COPY_CHUNK = 1 << 20


def import_cached(blobs: BlobStore, path: Path, file: HubFile, follower: Follower | None = None) -> str:
    """The digest of `file`, cached at `path`, once the store holds it; `follower` may have hashed it already."""
    if file.sha256 and blobs.exists(f"sha256:{file.sha256}"):
        return f"sha256:{file.sha256}"
    source = path.resolve()  # the cache's snapshot entries are links to its blobs
    followed = follower.digest(source) if follower else None
    digest = "sha256:" + (followed if followed and followed == file.sha256 else _durable_digest(source))
    if file.sha256 and digest != f"sha256:{file.sha256}":
        raise BlobCorrupt(f"{file.path} in the Hugging Face cache ({source}) is not what the Hub lists (sha256 "
                          f"{file.sha256}, it has {digest.removeprefix('sha256:')}); delete that file and pull again")
    if blobs.exists(digest):
        return digest
    try:
        blobs.link(source, digest)
    except OSError:
        _copy(blobs, source, digest)
    return digest


def _durable_digest(source: Path) -> str:
    with source.open("rb") as f, ThreadPoolExecutor(1, thread_name_prefix="plugd-fsync") as pool:
        # A blob's content is durable before its name vouches for it; the file just downloaded is still mostly in
        # the page cache, so writing it out (fsync) and reading it back to hash it overlap.
        durable = pool.submit(os.fsync, f.fileno())
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        durable.result()
    return digest


def _copy(blobs: BlobStore, source: Path, digest: str) -> None:
    try:
        with source.open("rb") as f, blobs.writer(digest) as writer:
            while chunk := f.read(COPY_CHUNK):
                writer.write(chunk)
            writer.commit()
    except DigestMismatch as exc:  # the cached file changed since it was hashed
        raise BlobCorrupt(f"{source} changed while it was copied into the store: {exc}") from None
