"""Anthropic's Messages API: /v1/messages (whole or streamed as SSE) and /v1/messages/count_tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, post

from plugd.chat import pipeline
from plugd.chat.pipeline import Delta, Final, Services
from plugd.server.anthropic_request import (
    ConversationBody,
    MessagesBody,
    conversation_request,
    messages_request,
    thinking_hidden,
)
from plugd.server.anthropic_response import MessageStream, whole_message
from plugd.server.bodies import json_body
from plugd.server.streaming import respond


def _headers(request: Request) -> dict[str, str]:
    return {name.lower(): value for name, value in request.headers.items()}


@post("/v1/messages", status_code=200, dependencies=json_body(MessagesBody))
async def messages(request: Request, services: Services, payload: MessagesBody) -> Any:
    chat = messages_request(payload, _headers(request))
    hidden = thinking_hidden(payload)

    async def whole(first: Delta | Final, events: AsyncIterator[Delta | Final]) -> dict[str, Any]:
        return await whole_message(payload.model, first, events, hidden)

    return await respond(request, services, chat, MessageStream(payload.model, hidden) if payload.stream else None, whole)


@post("/v1/messages/count_tokens", status_code=200, dependencies=json_body(ConversationBody))
async def count_tokens(request: Request, services: Services, payload: ConversationBody) -> dict[str, int]:
    chat = conversation_request(payload, _headers(request))
    return {"input_tokens": await pipeline.count_tokens(services, chat)}


ROUTES = [messages, count_tokens]
