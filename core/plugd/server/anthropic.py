"""Anthropic's Messages API: /v1/messages (whole or streamed as SSE) and /v1/messages/count_tokens."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post

from plugd.chat import pipeline
from plugd.server.anthropic_request import (
    ConversationBody,
    MessagesBody,
    conversation_request,
    messages_request,
    thinking_hidden,
)
from plugd.server.anthropic_response import message_stream, whole_message
from plugd.server.bodies import read_body
from plugd.server.disconnect import unless_disconnected
from plugd.server.sse import SSE, streamed


def _headers(request: Request) -> dict[str, str]:
    return {name.lower(): value for name, value in request.headers.items()}


@post("/v1/messages", status_code=200)
async def messages(request: Request) -> Any:
    body = await read_body(request, MessagesBody)
    chat = messages_request(body, _headers(request))
    events = pipeline.run(request.app.state.services, chat, prefill_events=body.stream)
    # Errors before the prefill starts become an HTTP error status; a stream opens as it starts.
    first = await unless_disconnected(request, anext(events))
    if body.stream:
        return streamed(message_stream(body.model, first, events, thinking_hidden(body)), SSE)
    return Response(await unless_disconnected(request, whole_message(body.model, first, events, thinking_hidden(body))))


@post("/v1/messages/count_tokens", status_code=200)
async def count_tokens(request: Request) -> dict[str, int]:
    body = await read_body(request, ConversationBody)
    chat = conversation_request(body, _headers(request))
    return {"input_tokens": await pipeline.count_tokens(request.app.state.services, chat)}


ROUTES = [messages, count_tokens]
