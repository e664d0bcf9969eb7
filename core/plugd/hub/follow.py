"""Checking a Hub file while huggingface_hub downloads it, so that its check costs no time after the download.

A blob must be verified and durable before the store names it. Hashing and writing out a file after its download
doubles a loopback pull's time; doing both as its bytes land hides them in the download. huggingface_hub keeps
its partial download private, so `Follower` finds it by the name its cache gives one (`blobs/<etag>.*.incomplete`,
the etag being an LFS file's sha256) and reads behind the writer. Whatever it cannot follow (another layout, a
download that restarts) only costs time: `digest` hashes what it did not see, and the caller compares the result
with the digest the Hub lists, hashing the whole file again before it calls a mismatch.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from plugd.store.blobs import start_writeback

POLL = 0.02  # seconds between looks at the partial file
CHUNK = 8 << 20


class Follower:
    def __init__(self, blobs_dir: Path, sha256: str):
        self.blobs_dir = blobs_dir
        self.pattern = f"{sha256}.*.incomplete"
        self.hasher = hashlib.sha256()
        self.offset = 0
        self.fd: int | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._follow, name="plugd-hub-follow", daemon=True)

    def __enter__(self) -> Follower:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop()
        if self.fd is not None:
            os.close(self.fd)

    def digest(self, path: Path) -> str | None:
        """The sha256 of the file at `path`, made durable (fsync), when it is the file followed; else None."""
        self._stop()
        if self.fd is None or not os.path.samestat(os.fstat(self.fd), os.stat(path)):
            return None
        self._catch_up()
        os.fsync(self.fd)
        return self.hasher.hexdigest()

    def _stop(self) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()

    def _follow(self) -> None:
        while not self.done.wait(POLL):
            if self.fd is None:
                self.fd = self._open()
            if self.fd is not None:
                self._catch_up()

    def _open(self) -> int | None:
        for path in self.blobs_dir.glob(self.pattern):
            try:
                return os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # finished and renamed since the glob
                continue
        return None

    def _catch_up(self) -> None:
        assert self.fd is not None
        size = os.fstat(self.fd).st_size
        while self.offset < size and (chunk := os.pread(self.fd, min(CHUNK, size - self.offset), self.offset)):
            self.hasher.update(chunk)
            start_writeback(self.fd, self.offset, len(chunk))
            self.offset += len(chunk)
