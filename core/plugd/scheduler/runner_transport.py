"""HTTP to a runner's Unix socket over asyncio's own streams.

httpx reaches a Unix socket through anyio's raw-socket stream, which wakes a pending read by calling `set_result`
from a selector callback. When the read is cancelled (a client hung up) in the same loop iteration as the socket
becomes readable, that callback meets a cancelled future and asyncio logs an InvalidStateError traceback for a
perfectly ordinary disconnect. asyncio's streams are protocol-driven and check for cancellation, so this backend
gives httpcore the same connection without the race.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx


class RunnerTransport(httpx.AsyncHTTPTransport):
    """httpx's transport, its connection pool dialling `socket` through `UnixStreams`."""

    def __init__(self, socket: str):
        super().__init__()
        # httpx offers no parameter for the network backend; the pool it would build is replaced before first use,
        # keeping httpx's keep-alive defaults. The scheduler bounds the requests in flight, so the pool does not.
        self._pool = httpcore.AsyncConnectionPool(uds=socket, network_backend=UnixStreams(), max_connections=None,
                                                  max_keepalive_connections=20, keepalive_expiry=5.0)


class UnixStreams(httpcore.AsyncNetworkBackend):
    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        with _raising(httpcore.ConnectTimeout, httpcore.ConnectError):
            reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), timeout)
        return _UnixStream(reader, writer)

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("a runner is reached over its Unix socket only")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _UnixStream(httpcore.AsyncNetworkStream):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader, self._writer = reader, writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        with _raising(httpcore.ReadTimeout, httpcore.ReadError):
            return await asyncio.wait_for(self._reader.read(max_bytes), timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        with _raising(httpcore.WriteTimeout, httpcore.WriteError):
            self._writer.write(buffer)
            await asyncio.wait_for(self._writer.drain(), timeout)

    async def aclose(self) -> None:
        self._writer.close()

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # asked of an idle pooled connection: readable there means the runner closed it
            return self._reader.at_eof() or self._writer.is_closing()
        return None


@contextmanager
def _raising(timeout: type[Exception], failure: type[Exception]):
    try:
        yield
    except TimeoutError as exc:
        raise timeout(str(exc)) from exc
    except OSError as exc:
        raise failure(str(exc)) from exc
