"""OpenAI's API: /v1/chat/completions, /v1/completions and /v1/models, translated onto the shared chat pipeline."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
from litestar import Request, get, post

from plugd.chat import pipeline
from plugd.chat.pipeline import ChatRequest, Delta, Final, Prefill, Services
from plugd.server import openai_request
from plugd.server.bodies import json_body
from plugd.server.openai_output import ChatWriter, TextWriter, Writer
from plugd.server.openai_request import ChatBody, CompletionBody
from plugd.server.sse import sse_event
from plugd.server.streaming import StreamFormat, respond
from plugd.store.names import DEFAULT_NAMESPACE, ModelName
from plugd.store.store import StoredModel


class _ChunkStream(StreamFormat):
    """Chat or text completion chunks as server-sent events, ending with [DONE]. The opening chunk (chat's role
    delta) goes out as the prefill starts; a failure once the stream has begun is an error event."""

    dialect = "openai"

    def __init__(self, path: str, writer: Writer):
        super().__init__(path)
        self.writer = writer

    def opening(self, first: Prefill | Delta | Final) -> bytes:
        return _events(self.writer.opening())

    def delta(self, delta: Delta) -> bytes:
        return _events(self.writer.chunks(delta))

    def closing(self, final: Final) -> bytes:
        return _events(self.writer.closing(final)) + sse_event("[DONE]")

    def failure(self, status: int, body: dict[str, Any], exc: Exception) -> bytes:
        return sse_event(body)


def _events(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(sse_event(chunk) for chunk in chunks)


async def _respond(request: Request, services: Services, chat: ChatRequest, writer: Writer, stream: bool) -> Any:
    async def whole(first: Delta | Final, events: AsyncIterator[Delta | Final]) -> dict[str, Any]:
        return writer.whole(*await pipeline.collect(first, events))

    return await respond(request, services, chat, _ChunkStream(request.url.path, writer) if stream else None, whole)


@post("/v1/chat/completions", status_code=200, dependencies=json_body(ChatBody, openai_request.read))
async def chat_completions(request: Request, services: Services, payload: ChatBody) -> Any:
    chat = openai_request.chat_request(request, payload)
    return await _respond(request, services, chat, ChatWriter(payload.model, payload.include_usage), payload.stream)


@post("/v1/completions", status_code=200, dependencies=json_body(CompletionBody, openai_request.read))
async def completions(request: Request, services: Services, payload: CompletionBody) -> Any:
    chat = openai_request.completion_request(request, payload)
    return await _respond(request, services, chat, TextWriter(payload.model, payload.include_usage), payload.stream)


def _model_entry(model: StoredModel) -> dict[str, Any]:
    namespace = model.name.namespace
    return {"id": model.name.display(), "object": "model", "created": int(model.modified_at.timestamp()),
            "owned_by": "library" if namespace == DEFAULT_NAMESPACE else namespace}


@get("/v1/models")
async def list_models(services: Services) -> dict[str, Any]:
    store = services.store
    return {"object": "list", "data": [_model_entry(m) for m in await anyio.to_thread.run_sync(store.list)]}


@get("/v1/models/{model_id:path}")
async def retrieve_model(services: Services, model_id: str) -> dict[str, Any]:
    store = services.store
    name = ModelName.parse(model_id.lstrip("/"))
    return _model_entry(await anyio.to_thread.run_sync(store.get, name))


ROUTES = [chat_completions, completions, list_models, retrieve_model]
