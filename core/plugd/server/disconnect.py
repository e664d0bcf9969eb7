"""Noticing a client that has gone while its response is still being worked out.

Before a response's first byte nothing is written, so a closed connection goes
unseen unless the app asks the server for it: ASGI delivers `http.disconnect`
through `receive` once the request's body is read. A streamed response is
watched by Litestar itself from its first byte on; until then, and for a whole
(non-streamed) response, the work runs under `unless_disconnected`, which
cancels it when the client goes, so the runner stops at its next prefill chunk
or decode step and the next request has it at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import anyio
from litestar import Request

from plugd.errors import PlugdError

T = TypeVar("T")


class ClientGone(PlugdError):
    """The client closed its connection before its response was ready; the work for it was cancelled."""

    status = 499


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result (or its exception); ClientGone, `work` cancelled, if the client disconnects first. The
    request's body must have been read (a body message still to come would be taken for nothing)."""
    with anyio.CancelScope() as scope:
        watcher = asyncio.ensure_future(_cancel_on_disconnect(request, scope))
        try:
            return await work
        finally:
            watcher.cancel()
    raise ClientGone(f"the client of {request.method} {request.url.path} disconnected; its request was cancelled")


async def _cancel_on_disconnect(request: Request, scope: anyio.CancelScope) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    scope.cancel()
