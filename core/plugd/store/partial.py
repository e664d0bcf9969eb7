"""Downloads in progress: `blobs/partial/sha256-<hex>` and, beside it, a `.parts` file of what is already there;
and one `pull-*` record per pull, holding the manifest whose blobs it is fetching.

Readers of the store never look in `blobs/partial/`. A download becomes a blob only when the caller has
verified its digest (`publish`: fsync, rename into `blobs/`, fsync the directory). What is left of an
interrupted download stays for the next one to continue.

A running download or pull holds a lock (flock) on its file, which any process can test. Its record keeps a
pull's blobs from being pruned before its manifest is written: while the pull runs, and for `STALE_AFTER`
after an interrupted one, so the next pull resumes instead of starting over. Leftovers older than that, that
nothing holds, are removed by `remove_stale`.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from attrs import define

from plugd.store.blobs import DIGEST, BlobStore, fsync_dir, parse_digest, start_writeback, write_atomically
from plugd.store.manifests import MalformedManifest, Manifest

log = logging.getLogger(__name__)

PARTIAL_DIR = "partial"
RECORD_PREFIX = "pull-"
DIRECT_BLOCK = 4096  # the alignment direct I/O needs (of offsets, sizes and buffers)
STALE_AFTER = 7 * 24 * 3600  # seconds an interrupted pull's leftovers wait for the next pull to resume them


@define
class Part:
    offset: int
    size: int
    done: int = 0

    @property
    def end(self) -> int:
        return self.offset + self.size

    @property
    def remaining(self) -> int:
        return self.size - self.done


def partial_path(blobs: BlobStore, digest: str) -> Path:
    return blobs.root / PARTIAL_DIR / f"sha256-{parse_digest(digest)}"


def bytes_on_disk(blobs: BlobStore, digest: str) -> int:
    """Space an interrupted download of `digest` already takes (0 when there is none)."""
    try:
        return partial_path(blobs, digest).stat().st_blocks * 512
    except FileNotFoundError:
        return 0


def plan_parts(size: int, part_size: int) -> list[Part]:
    return [Part(offset, min(part_size, size - offset)) for offset in range(0, size, part_size)] or [Part(0, 0)]


class PartialBlob:
    """One blob being downloaded; a context manager holding an exclusive lock on it (another download of the
    same blob, in this process or another, waits)."""

    def __init__(self, blobs: BlobStore, digest: str, size: int):
        self.blobs = blobs
        self.digest = digest
        self.size = size
        self.path = partial_path(blobs, digest)
        self.path.parent.mkdir(exist_ok=True)
        self.parts_path = self.path.with_name(self.path.name + ".parts")
        self.fd = -1
        self.direct_fd = -1  # the same file opened for direct I/O, where the file system allows it

    def __enter__(self) -> PartialBlob:
        while True:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX)
                if _is_linked(self.fd, self.path):
                    self.direct_fd = _open_direct(self.path)
                    return self
            except BaseException:
                os.close(self.fd)
                raise
            os.close(self.fd)  # `remove_stale` deleted it between the open and the lock: open the path again

    def __exit__(self, *exc) -> None:
        if self.direct_fd >= 0:
            os.close(self.direct_fd)
            self.direct_fd = -1
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock
            self.fd = -1

    def parts(self, part_size: int) -> list[Part]:
        """The parts recorded by an earlier download of this blob, or a fresh plan."""
        try:
            state = json.loads(self.parts_path.read_bytes())
            on_disk = os.fstat(self.fd).st_size
            parts = [Part(*p) for p in state["parts"]] if state["size"] == self.size else []
            if sum(p.size for p in parts) == self.size and all(0 <= p.done <= p.size for p in parts) and all(
                    p.offset + p.done <= on_disk for p in parts):
                return parts
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return plan_parts(self.size, part_size)

    def save(self, parts: list[Part]) -> None:
        state = {"size": self.size, "parts": [[p.offset, p.size, p.done] for p in parts]}
        write_atomically(self.parts_path, json.dumps(state).encode())

    def write(self, data: bytes | memoryview, offset: int) -> None:
        """Write `data` at `offset`. Whole blocks at a block boundary, from a page-aligned buffer (an mmap), go
        straight to the disk (O_DIRECT): no copy into the page cache, which on a busy machine costs more CPU
        than hashing the same bytes, and nothing left for the fsync before `publish`."""
        if self.direct_fd >= 0 and offset % DIRECT_BLOCK == 0 and len(data) % DIRECT_BLOCK == 0:
            try:
                return _write_all(self.direct_fd, data, offset)
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # an unaligned buffer: written through the page cache instead
                    raise
        _write_all(self.fd, data, offset)

    def start_writeback(self, offset: int, length: int) -> None:
        """Ask the kernel to start writing this range to disk now, so the fsync at the end has little left to do."""
        start_writeback(self.fd, offset, length)

    def publish(self) -> Path:
        """Move the (verified) download into the store, durably."""
        os.fsync(self.fd)
        final = self.blobs.path(self.digest)
        os.replace(self.path, final)
        fsync_dir(self.blobs.root)
        self.parts_path.unlink(missing_ok=True)
        return final

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)
        self.parts_path.unlink(missing_ok=True)


@contextmanager
def pull_record(blobs: BlobStore, manifest: bytes) -> Iterator[None]:
    """Record, for the duration of the block, that a pull is fetching the blobs of `manifest` (its bytes). When
    the block ends normally (the manifest is in the store), this and every other record of the same manifest
    that no pull holds are removed; when it fails, the record stays for `STALE_AFTER`."""
    directory = blobs.root / PARTIAL_DIR
    directory.mkdir(exist_ok=True)
    key = f"{RECORD_PREFIX}{hashlib.sha256(manifest).hexdigest()[:16]}-"
    fd = os.open(directory / f"{key}{uuid.uuid4().hex}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        view = memoryview(manifest)
        while view:
            view = view[os.write(fd, view):]
        yield
    finally:
        os.close(fd)
    for path in directory.glob(f"{key}*"):
        _remove_unless_held(path)


def _digests(manifest: bytes) -> set[str]:
    try:
        return Manifest.from_bytes(manifest).digests()
    except MalformedManifest:
        return set()  # a record still being written


def pulled_digests(blobs: BlobStore, stale_after: float = STALE_AFTER) -> set[str]:
    """The blobs of pulls that are running, or were interrupted less than `stale_after` seconds ago."""
    return {digest for raw in pulling(blobs, stale_after) for digest in _digests(raw)}


def pulling(blobs: BlobStore, stale_after: float) -> list[bytes]:
    """The manifests of pulls that are running, or were interrupted less than `stale_after` seconds ago."""
    manifests = []
    for path in (blobs.root / PARTIAL_DIR).glob(f"{RECORD_PREFIX}*"):
        try:
            if _held(path) or not _older_than(path, stale_after):
                manifests.append(path.read_bytes())
        except FileNotFoundError:
            pass  # its pull just finished
    return manifests


def remove_stale(blobs: BlobStore, stale_after: float = STALE_AFTER) -> None:
    """Remove what interrupted pulls left behind more than `stale_after` seconds ago and nothing holds: records,
    partial files with their `.parts`; also `.parts` files without their partial file."""
    directory = blobs.root / PARTIAL_DIR
    wanted = {f"sha256-{parse_digest(digest)}" for digest in pulled_digests(blobs, stale_after)}
    for path in sorted(directory.glob("*")):
        if path.name in wanted:
            continue
        if path.suffix == ".parts":
            if not path.with_suffix("").exists():
                path.unlink(missing_ok=True)
        elif path.name.startswith(RECORD_PREFIX) or DIGEST.fullmatch(path.name):
            try:
                if _older_than(path, stale_after) and _remove_unless_held(path):
                    log.info("removed %s, left by a pull interrupted over %.0f hours ago", path, stale_after / 3600)
                    path.with_name(path.name + ".parts").unlink(missing_ok=True)
            except FileNotFoundError:
                pass


def _older_than(path: Path, seconds: float) -> bool:
    return time.time() - path.stat().st_mtime > seconds


def _held(path: Path) -> bool:
    """Whether a running download or pull holds `path` (it would block an exclusive lock)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _remove_unless_held(path: Path) -> bool:
    """Delete `path` unless something holds it; True when deleted. Deleted while locked, so whoever opens it
    next and locks it finds it unlinked (see `PartialBlob.__enter__`)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not _is_linked(fd, path):
            return False
        path.unlink()
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _is_linked(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is still the one at `path`."""
    try:
        there = path.stat()
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _open_direct(path: Path) -> int:
    if not hasattr(os, "O_DIRECT"):
        return -1
    try:
        return os.open(path, os.O_WRONLY | os.O_DIRECT)
    except OSError:
        return -1  # e.g. tmpfs


def is_disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)

