"""Downloads in progress: `blobs/partial/sha256-<hex>` and, beside it, a `.parts` file of what is already there.

Readers of the store never look in `blobs/partial/`. A download becomes a blob only when the caller has
verified its digest (`publish`: fsync, rename into `blobs/`, fsync the directory). What is left of an
interrupted download stays for the next one to continue.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import sys
from pathlib import Path

from attrs import define

from plugd.store.blobs import BlobStore, fsync_dir, parse_digest, write_atomically

PARTIAL_DIR = "partial"


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

    def __enter__(self) -> PartialBlob:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(self.fd)
            raise
        return self

    def __exit__(self, *exc) -> None:
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
        view = memoryview(data)
        while view:
            written = os.pwrite(self.fd, view, offset)
            view, offset = view[written:], offset + written

    def start_writeback(self, offset: int, length: int) -> None:
        """Ask the kernel to start writing this range to disk now, so the fsync at the end has little left to do."""
        if _sync_file_range is not None and length > 0:
            _sync_file_range(self.fd, offset, length, _SYNC_FILE_RANGE_WRITE)

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


def is_disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


_SYNC_FILE_RANGE_WRITE = 2


def _load_sync_file_range():
    if not sys.platform.startswith("linux"):
        return None
    function = getattr(ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True), "sync_file_range", None)
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


_sync_file_range = _load_sync_file_range()
