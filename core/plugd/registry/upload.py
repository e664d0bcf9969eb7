"""Uploading one blob: skipped when the registry has it, mounted from another repository where the registry
offers that, else sent in chunks, each to the Location the registry's last answer gave, then committed."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from functools import partial

import httpx

from plugd.registry.client import RegistryClient
from plugd.registry.errors import RegistryError, RegistryUnreachable, TransferCancelled
from plugd.registry.progress import Progress
from plugd.store.manifests import Layer
from plugd.store.store import Store

CHUNK_SIZE = 64 << 20
READ_SIZE = 1 << 20
RETRIES = 3
BACKOFF = 0.5


class _Transient(Exception):
    pass


class BlobUpload:
    def __init__(self, client: RegistryClient, store: Store, layer: Layer, mount_from: str | None, progress: Progress,
                 cancel: threading.Event, chunk_size: int = CHUNK_SIZE):
        self.client = client
        self.path = store.blobs.path(layer.digest)
        self.digest = layer.digest
        self.size = layer.size
        self.mount_from = mount_from
        self.progress = progress
        self.cancel = cancel
        self.chunk_size = chunk_size

    def run(self) -> None:
        self.progress.layer(self.digest, self.size, 0)
        if not self.client.blob_exists(self.digest):
            location = self._mount_or_open()
            if location is not None:
                self._upload(location)
        self.progress.layer(self.digest, self.size, self.size)

    def _mount_or_open(self) -> httpx.URL | None:
        """An upload session; None when the registry mounted the blob from another repository instead (a registry
        that does not offer that opens an upload session in answer to the mount request)."""
        if self.mount_from:
            return self.client.start_upload(self.digest, self.mount_from)
        return self.client.start_upload()

    def _upload(self, location: httpx.URL) -> None:
        offset, failures = 0, 0
        fd = os.open(self.path, os.O_RDONLY)
        try:
            while offset < self.size:
                length = min(self.chunk_size, self.size - offset)
                try:
                    location = self._send_chunk(location, fd, offset, length)
                    offset, failures = offset + length, 0
                except (httpx.TransportError, _Transient) as exc:
                    failures += 1
                    if failures > RETRIES:
                        raise RegistryUnreachable(f"uploading blob {self.digest} to {self.client.name.host} failed "
                                                  f"{failures} times in a row: {exc}") from None
                    time.sleep(BACKOFF * failures)
                    location, offset = self._upload_status(location)
                self.progress.layer(self.digest, self.size, offset)
        finally:
            os.close(fd)
        response = self.client.send("PUT", location.copy_merge_params({"digest": self.digest}))
        if response.status_code not in (201, 204):
            raise self.client.fail(response, f"commit blob {self.digest}")

    def _send_chunk(self, location: httpx.URL, fd: int, offset: int, length: int) -> httpx.URL:
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(length),
                   "Content-Range": f"{offset}-{offset + length - 1}"}
        response = self.client.send("PATCH", location, headers=headers, body=partial(self._read, fd, offset, length))
        if response.status_code >= 500 or response.status_code == 429:
            raise _Transient(f"HTTP {response.status_code}")
        if response.status_code != 202:
            raise self.client.fail(response, f"upload blob {self.digest}")
        return self.client.location(response)

    def _read(self, fd: int, offset: int, length: int) -> Iterator[bytes]:
        end = offset + length
        while offset < end:
            if self.cancel.is_set():
                raise TransferCancelled(f"push of blob {self.digest} cancelled")
            data = os.pread(fd, min(READ_SIZE, end - offset), offset)
            if not data:
                raise RegistryError(f"blob {self.digest} in the store is shorter than its manifest says")
            offset += len(data)
            self.progress.layer(self.digest, self.size, offset)
            yield data

    def _upload_status(self, location: httpx.URL) -> tuple[httpx.URL, int]:
        """Where an interrupted upload stands: its location and the offset the registry has (`Range: 0-<last>`;
        docker's registry says `0-0` for an empty upload too, and an upload that failed after one byte is rarer)."""
        response = self.client.send("GET", location)
        if response.status_code != 204:
            raise self.client.fail(response, f"resume upload of blob {self.digest}")
        received = re.fullmatch(r"(?:bytes=)?0-(\d+)", response.headers.get("range", "").strip())
        last = int(received.group(1)) if received else 0
        return self.client.location(response), last + 1 if last > 0 else 0
