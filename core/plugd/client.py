"""The CLI's connection to a running daemon, with errors a user can act on."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from plugd.settings import daemon_url


class DaemonError(RuntimeError):
    """The daemon is unreachable or answered with an error; the message is ready to print. `status` is the HTTP
    status of an error answer (None when there was no answer, or the error came inside a stream)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class DaemonClient:
    def __init__(self, url: str | None = None):
        self.url = url or daemon_url()
        self.http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(30.0, read=None))

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.ConnectError:
            raise DaemonError(f"could not connect to plugd at {self.url}; is `plugd serve` running?") from None
        _raise_for_error(response)
        return response

    def json(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        response = self._send(method, path, json=body)
        return response.json() if response.content else None

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """POST `body` and yield each NDJSON line; an {"error": ...} line raises DaemonError."""
        try:
            with self.http.stream("POST", path, json=body) as response:
                if response.is_error:
                    response.read()
                    _raise_for_error(response)
                for line in response.iter_lines():
                    if line.strip():
                        item = json.loads(line)
                        if "error" in item:
                            raise DaemonError(item["error"])
                        yield item
        except httpx.ConnectError:
            raise DaemonError(f"could not connect to plugd at {self.url}; is `plugd serve` running?") from None

    def upload_blob(self, path: Path) -> str:
        """Upload a file as a blob unless the daemon already has it; returns its digest."""
        digest = "sha256:" + _sha256_file(path)
        if self._send("HEAD", f"/api/blobs/{digest}").status_code == 200:
            return digest
        with path.open("rb") as f:
            self._send("POST", f"/api/blobs/{digest}", content=_chunks(f))
        return digest


def _raise_for_error(response: httpx.Response) -> None:
    if response.status_code < 400 or response.request.method == "HEAD":
        return
    try:
        message = response.json().get("error")
    except ValueError:
        message = None
    raise DaemonError(message or f"{response.status_code} {response.reason_phrase}", response.status_code)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in _chunks(f):
            h.update(chunk)
    return h.hexdigest()


def _chunks(f, size: int = 1 << 20) -> Iterator[bytes]:
    while chunk := f.read(size):
        yield chunk
