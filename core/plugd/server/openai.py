"""OpenAI's API: /v1/chat/completions, /v1/completions and /v1/models, translated onto the shared chat pipeline."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
from litestar import Request, Response, get, post

from plugd.chat import pipeline
from plugd.chat.pipeline import ChatRequest, Delta, Final, Prefill, UnparseableOutput
from plugd.scheduler.runner_client import RunnerError
from plugd.server import openai_request
from plugd.server.disconnect import unless_disconnected
from plugd.server.errors import error_body
from plugd.server.openai_output import ChatWriter, TextWriter, Writer
from plugd.server.openai_request import ChatBody, CompletionBody
from plugd.server.sse import SSE, sse_comment, sse_event, streamed
from plugd.store.names import DEFAULT_NAMESPACE, ModelName
from plugd.store.store import StoredModel

log = logging.getLogger(__name__)


async def _sse(path: str, writer: Writer, first: Prefill | Delta | Final,
               events: AsyncIterator[Prefill | Delta | Final]) -> AsyncIterator[bytes]:
    """The chunks as server-sent events, ending with [DONE]; a failure mid-stream is written as an error event.

    The opening chunk (chat's role delta) goes out as the prefill starts; each prefill event sends an SSE
    comment, which clients skip, so that their idle timeouts do not fire during a long prefill."""
    event = first
    try:
        for chunk in writer.opening():
            yield sse_event(chunk)
        while not isinstance(event, Final):
            if isinstance(event, Prefill):
                yield sse_comment("prefill")
            else:
                for chunk in writer.chunks(event):
                    yield sse_event(chunk)
            event = await anext(events)
        for chunk in writer.closing(event):
            yield sse_event(chunk)
        yield sse_event("[DONE]")
    except (RunnerError, UnparseableOutput, ValueError) as exc:
        log.error("%s on %s failed mid-stream: %s", path, writer.model, exc)
        yield sse_event(error_body(path, 500, str(exc)))
    finally:
        await events.aclose()


async def _respond(request: Request, chat: ChatRequest, writer: Writer, stream: bool) -> Any:
    events = pipeline.run(request.app.state.services, chat, prefill_events=stream)
    # Errors before the prefill starts become an HTTP error status; a stream opens as it starts.
    first = await unless_disconnected(request, anext(events))
    if stream:
        return streamed(_sse(request.url.path, writer, first, events), SSE)
    # The runner is released before the response goes out.
    total, final = await unless_disconnected(request, pipeline.collect(first, events))
    return Response(writer.whole(total, final))


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request) -> Any:
    body = await openai_request.read(request, ChatBody)
    chat = openai_request.chat_request(request, body)
    return await _respond(request, chat, ChatWriter(body.model, body.include_usage), body.stream)


@post("/v1/completions", status_code=200)
async def completions(request: Request) -> Any:
    body = await openai_request.read(request, CompletionBody)
    chat = openai_request.completion_request(request, body)
    return await _respond(request, chat, TextWriter(body.model, body.include_usage), body.stream)


def _model_entry(model: StoredModel) -> dict[str, Any]:
    namespace = model.name.namespace
    return {"id": model.name.display(), "object": "model", "created": int(model.modified_at.timestamp()),
            "owned_by": "library" if namespace == DEFAULT_NAMESPACE else namespace}


@get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    store = request.app.state.services.store
    return {"object": "list", "data": [_model_entry(m) for m in await anyio.to_thread.run_sync(store.list)]}


@get("/v1/models/{model_id:path}")
async def retrieve_model(request: Request, model_id: str) -> dict[str, Any]:
    store = request.app.state.services.store
    name = ModelName.parse(model_id.lstrip("/"))
    return _model_entry(await anyio.to_thread.run_sync(store.get, name))


ROUTES = [chat_completions, completions, list_models, retrieve_model]
