"""How every dialect answers from the chat pipeline: a stream that opens as soon as there is something to say (the
request queued, or its prefill started), or the whole response once it is done.

Until the stream opens, a failure is the response's error status; after, it is the dialect's error event, and the
stream ends there. A client that leaves before either cancels the request (`unless_disconnected`); once a stream
is open Litestar itself watches for it.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from litestar import Request, Response

from plugd.chat import pipeline
from plugd.chat.pipeline import ChatRequest, Delta, Final, Prefill, Queued, Services
from plugd.server.disconnect import unless_disconnected
from plugd.server.errors import Dialect, failure_body
from plugd.server.sse import SSE, sse_comment, streamed

log = logging.getLogger(__name__)

Event = Queued | Prefill | Delta | Final


class StreamFormat(ABC):
    """One dialect's stream of one route (`path`): the bytes for each pipeline event."""

    media_type = SSE
    dialect: Dialect

    def __init__(self, path: str):
        self.path = path

    def waiting(self) -> bytes:
        """While the request is queued: a comment, which clients skip, on an event stream."""
        return sse_comment("queued")

    @abstractmethod
    def opening(self, first: Prefill | Delta | Final) -> bytes:
        """What the stream starts with, given its first event after any wait (it is then handled as any other)."""

    def keep_alive(self, prefill: Prefill) -> bytes:
        """A prefill chunk done: traffic, so that the client's idle timeout does not fire before the first token."""
        return sse_comment("prefill")

    @abstractmethod
    def delta(self, delta: Delta) -> bytes: ...

    @abstractmethod
    def closing(self, final: Final) -> bytes: ...

    @abstractmethod
    def failure(self, status: int, body: dict[str, Any], exc: Exception) -> bytes:
        """The error event for a failure once the stream has begun; `body` is the dialect's error object for it."""


async def respond(request: Request, services: Services, chat: ChatRequest, stream: StreamFormat | None,
                  whole: Callable[[Delta | Final, AsyncIterator[Delta | Final]], Awaitable[Any]]) -> Any:
    """The response to `chat`: streamed in `stream`'s format, or (`stream` None) `whole`'s result for the first
    event and the rest, which closes the pipeline, releasing the runner, before the response goes out."""
    events = pipeline.run(services, chat, progress=stream is not None)
    first = await unless_disconnected(request, anext(events))
    if stream is not None:
        return streamed(write_stream(stream, first, events), stream.media_type)
    return Response(await unless_disconnected(request, whole(first, events)))


async def write_stream(stream: StreamFormat, first: Event, events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    event = first
    try:
        if isinstance(event, Queued):
            yield stream.waiting()
            event = await anext(events)
        yield stream.opening(event)
        while not isinstance(event, Final):
            yield stream.keep_alive(event) if isinstance(event, Prefill) else stream.delta(event)
            event = await anext(events)
        yield stream.closing(event)
    except Exception as exc:  # noqa: BLE001 - every failure becomes the dialect's error event
        status, body = failure_body(stream.dialect, stream.path, exc)
        log.log(logging.ERROR if status >= 500 else logging.INFO, "%s failed mid-stream: %s", stream.path, exc)
        yield stream.failure(status, body, exc)
    finally:
        await events.aclose()
