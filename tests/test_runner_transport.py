"""The daemon's HTTP transport to a runner's socket, against a real HTTP server on a Unix socket."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from plugd.scheduler.runner_transport import RunnerTransport

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@asynccontextmanager
async def streaming_server(path: Path, writers: asyncio.Queue) -> AsyncIterator[None]:
    """Answers every request with the head and one line of a chunked stream, then hands its writer to the test."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(HEAD + chunk(b'{"n": 0}\n'))
        await writers.put(writer)

    server = await asyncio.start_unix_server(serve, path=str(path))
    try:
        yield
    finally:
        server.close()


def test_a_read_cancelled_as_its_bytes_arrive_logs_nothing(tmp_path):
    """The hang-up race: a streaming read is cancelled in the loop iteration where the runner's next bytes land."""
    assert asyncio.run(cancelled_reads(tmp_path)) == []


async def cancelled_reads(tmp_path: Path) -> list[dict]:
    """What asyncio's exception handler reported over 20 reads cancelled that way."""
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    writers: asyncio.Queue = asyncio.Queue()
    async with streaming_server(tmp_path / "runner.sock", writers), \
            httpx.AsyncClient(transport=RunnerTransport(str(tmp_path / "runner.sock")), base_url="http://runner") as http:
        for _ in range(20):
            await cancel_as_bytes_arrive(http, writers)
    return reported


async def cancel_as_bytes_arrive(http: httpx.AsyncClient, writers: asyncio.Queue) -> None:
    async def read_stream() -> None:
        async with http.stream("POST", "/completion") as response:
            async for _ in response.aiter_lines():
                pass

    loop = asyncio.get_running_loop()
    reader = asyncio.ensure_future(read_stream())
    writer = await writers.get()
    await asyncio.sleep(0.01)  # the reader waits on the socket again
    hang_up, hung_up = socket.socketpair()
    # A client's disconnect, seen in the same select as the runner's bytes and handled before them.
    loop.add_reader(hung_up, lambda: (hung_up.recv(1), reader.cancel()))
    hang_up.send(b"x")
    writer.write(chunk(b'{"n": 1}\n'))
    with pytest.raises(asyncio.CancelledError):
        await reader
    loop.remove_reader(hung_up)
    hang_up.close(), hung_up.close(), writer.close()
    await asyncio.sleep(0.01)


def test_a_missing_socket_is_a_connect_error(tmp_path):
    asyncio.run(missing_socket(tmp_path))


async def missing_socket(tmp_path: Path) -> None:
    async with httpx.AsyncClient(transport=RunnerTransport(str(tmp_path / "none.sock")), base_url="http://r") as http:
        with pytest.raises(httpx.ConnectError):
            await http.get("/status")


def test_a_silent_runner_is_a_read_timeout(tmp_path):
    asyncio.run(silent_runner(tmp_path))


async def silent_runner(tmp_path: Path) -> None:
    writers: asyncio.Queue = asyncio.Queue()
    async with streaming_server(tmp_path / "runner.sock", writers), \
            httpx.AsyncClient(transport=RunnerTransport(str(tmp_path / "runner.sock")), base_url="http://runner",
                              timeout=httpx.Timeout(5.0, read=0.2)) as http:
        with pytest.raises(httpx.ReadTimeout):
            async with http.stream("POST", "/completion") as response:
                async for _ in response.aiter_lines():
                    pass
