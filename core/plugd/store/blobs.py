"""Content-addressed blobs: `blobs/sha256-<hex>`, only ever visible complete and verified."""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import re
import sys
import tempfile
import uuid
from pathlib import Path

from plugd.errors import PlugdError

DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")
PARTIAL_PREFIX = ".partial-"


class InvalidDigest(PlugdError, ValueError):
    status = 400

    pass


class DigestMismatch(PlugdError, ValueError):
    status = 400

    pass


def parse_digest(digest: str) -> str:
    """The hex part of `sha256:<hex>` (or `sha256-<hex>`); raises InvalidDigest for anything else."""
    m = DIGEST.fullmatch(digest or "")
    if not m:
        raise InvalidDigest(f"invalid digest {digest!r}: expected sha256:<64 lowercase hex digits>")
    return m.group(1)


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing this range of a file to disk now, so that an fsync later has little left to
    do (Linux; elsewhere nothing happens until the fsync)."""
    if _sync_file_range is not None and length > 0:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Write a small file so that readers see either the old content or the new, never a mix."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=PARTIAL_PREFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


class BlobWriter:
    """Receives a blob's bytes into a hidden temporary file; `commit` verifies the digest and publishes it.

    Used as a context manager: leaving the block without a commit discards the temporary file.
    """

    def __init__(self, store: BlobStore, digest: str):
        self.store = store
        self.hex = parse_digest(digest)
        fd, tmp = tempfile.mkstemp(dir=store.root, prefix=PARTIAL_PREFIX)
        self.tmp = Path(tmp)
        self.file = os.fdopen(fd, "wb")
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.file.write(chunk)
        self.hash.update(chunk)
        self.size += len(chunk)

    def commit(self) -> Path:
        try:
            actual = self.hash.hexdigest()
            if actual != self.hex:
                raise DigestMismatch(f"digest mismatch: expected sha256:{self.hex}, got sha256:{actual}")
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            final = self.store.path(f"sha256:{self.hex}")
            os.replace(self.tmp, final)
            fsync_dir(self.store.root)
            return final
        finally:
            self.abort()

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.abort()

    def abort(self) -> None:
        if not self.file.closed:
            self.file.close()
        self.tmp.unlink(missing_ok=True)


class BlobStore:
    def __init__(self, root: Path):
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        return self.root / f"sha256-{parse_digest(digest)}"

    def exists(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def size(self, digest: str) -> int:
        return self.path(digest).stat().st_size

    def digests(self) -> set[str]:
        return {f"sha256:{p.name[7:]}" for p in self.root.glob("sha256-*") if DIGEST.fullmatch(p.name)}

    def remove(self, digest: str) -> None:
        self.path(digest).unlink(missing_ok=True)

    def remove_partials(self) -> None:
        """Drop temporary files left by writers that died; only called before the daemon accepts requests."""
        for p in self.root.glob(PARTIAL_PREFIX + "*"):
            p.unlink(missing_ok=True)

    def writer(self, digest: str) -> BlobWriter:
        return BlobWriter(self, digest)

    def import_file(self, path: Path) -> str:
        """Store a local file's content and return its digest."""
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        digest = "sha256:" + h.hexdigest()
        if not self.exists(digest):
            with path.open("rb") as f, self.writer(digest) as w:
                while chunk := f.read(1 << 20):
                    w.write(chunk)
                w.commit()
        return digest

    def link(self, path: Path, digest: str) -> None:
        """Make the file at `path`, whose content the caller has checked against `digest` and made durable (fsync),
        a blob by a hard link: no second copy. OSError where `path` is on another file system, or the file system
        refuses links."""
        tmp = self.root / f"{PARTIAL_PREFIX}{uuid.uuid4().hex}"
        os.link(path, tmp)
        try:
            os.replace(tmp, self.path(digest))
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(self.root)

    def write_bytes(self, data: bytes) -> str:
        """Store `data` and return its digest (used for small layers the daemon writes itself)."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if not self.exists(digest):
            with self.writer(digest) as w:
                w.write(data)
                w.commit()
        return digest


_SYNC_FILE_RANGE_WRITE = 2


def _load_sync_file_range():
    if not sys.platform.startswith("linux"):
        return None
    function = getattr(ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True), "sync_file_range", None)
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


_sync_file_range = _load_sync_file_range()
