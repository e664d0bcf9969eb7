"""Streaming responses: server-sent events as the OpenAI and Anthropic dialects frame them, and NDJSON."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from litestar.response import Stream


def sse_event(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One event: an optional `event:` line, then the data (a JSON object, or a bare string such as "[DONE]")."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def sse_comment(text: str) -> bytes:
    """A comment line: clients skip it, but it is traffic, so idle timeouts do not fire while nothing else comes."""
    return f": {text}\n\n".encode()


def streamed(chunks: AsyncIterator[bytes] | Iterator[bytes], media_type: str) -> Stream:
    """A streaming response with this content type.

    Litestar 2 lets the route's default media type (JSON) override a
    Stream's own, so the content type goes in as an explicit header.
    """
    return Stream(chunks, headers={"content-type": media_type, "cache-control": "no-cache"})


SSE = "text/event-stream; charset=utf-8"
NDJSON = "application/x-ndjson"
