"""Ollama's /api/generate and /api/chat: translated onto the shared chat pipeline, written back as NDJSON."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from attrs import define, field
from litestar import Request, Response, post

from plugd.chat import pipeline
from plugd.chat.pipeline import ChatRequest, Delta, Final, Prefill, Services
from plugd.media import base64_image
from plugd.server.bodies import BadRequest, json_body
from plugd.server.sse import NDJSON
from plugd.server.streaming import StreamFormat, respond
from plugd.types import Media, Message, Think, Tool, ToolCall


@define
class OllamaToolCallFunction:
    name: str
    arguments: dict[str, Any] = field(factory=dict)


@define
class OllamaToolCall:
    function: OllamaToolCallFunction


@define
class OllamaMessage:
    role: str
    content: str = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None


@define
class OllamaFunction:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(factory=dict)


@define
class OllamaTool:
    function: OllamaFunction
    type: str = "function"


@define(kw_only=True)
class _GenerationBody:
    """What /api/generate and /api/chat bodies have in common."""

    model: str
    format: Any = None
    think: Think = None
    stream: bool = True
    keep_alive: str | int | float | None = None
    options: dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    _debug_render_only: bool = field(default=False, alias="_debug_render_only")


@define(kw_only=True)
class GenerateBody(_GenerationBody):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    raw: bool = False
    images: list[str] | None = None


@define(kw_only=True)
class ChatBody(_GenerationBody):
    messages: list[OllamaMessage] = field(factory=list)
    tools: list[OllamaTool] | None = None


def _images(encoded: list[str] | None) -> list[Media]:
    try:
        return [base64_image(text) for text in encoded or []]
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def _message(m: OllamaMessage) -> Message:
    calls = [ToolCall(c.function.name, c.function.arguments) for c in m.tool_calls or []]
    if m.role not in ("system", "developer", "user", "assistant", "tool"):
        raise BadRequest(f"invalid message role {m.role!r}")
    return Message(m.role, m.content, thinking=m.thinking, images=_images(m.images), tool_calls=calls,
                   tool_name=m.tool_name)


def _common(request: Request, body: _GenerationBody) -> dict[str, Any]:
    if body.top_logprobs < 0 or body.top_logprobs > 20:
        raise BadRequest("top_logprobs must be between 0 and 20")
    return {"model": body.model, "think": body.think, "options": body.options or {}, "keep_alive": body.keep_alive,
            "format": body.format, "logprobs": body.logprobs, "top_logprobs": body.top_logprobs,
            "headers": dict(request.headers)}


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _final_fields(final: Final) -> dict[str, Any]:
    return {
        "done": True,
        "done_reason": final.done_reason,
        "total_duration": final.total_duration,
        "load_duration": final.load_duration,
        "prompt_eval_count": final.prompt_eval_count,
        "prompt_eval_duration": final.prompt_eval_duration,
        "eval_count": final.eval_count,
        "eval_duration": final.eval_duration,
    }


def _assistant(delta: Delta) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": delta.content}
    if delta.thinking:
        message["thinking"] = delta.thinking
    if delta.tool_calls:
        message["tool_calls"] = [{"function": {"name": c.name, "arguments": c.arguments}} for c in delta.tool_calls]
    return message


def _chunk(kind: str, model: str, delta: Delta) -> dict[str, Any]:
    out: dict[str, Any] = {"model": model, "created_at": _now()}
    if kind == "chat":
        out["message"] = _assistant(delta)
    else:
        out["response"] = delta.content
        if delta.thinking:
            out["thinking"] = delta.thinking
    if delta.logprobs:
        out["logprobs"] = delta.logprobs
    out["done"] = False
    return out


class _LineStream(StreamFormat):
    """One JSON object per line: a chunk per delta, then one with the final counts; a failure once the stream has
    begun is an `{"error": ...}` line, which Ollama's clients raise. NDJSON has no comments: nothing is written
    while the request waits, or for a prefill chunk."""

    dialect = "ollama"

    media_type = NDJSON

    def __init__(self, path: str, kind: str, model: str):
        super().__init__(path)
        self.kind, self.model = kind, model

    def waiting(self) -> bytes:
        return b""

    def opening(self, first: Prefill | Delta | Final) -> bytes:
        return b""

    def keep_alive(self, prefill: Prefill) -> bytes:
        return b""

    def delta(self, delta: Delta) -> bytes:
        return _line(_chunk(self.kind, self.model, delta))

    def closing(self, final: Final) -> bytes:
        return _line(_chunk(self.kind, self.model, Delta()) | _final_fields(final))

    def failure(self, status: int, body: dict[str, Any], exc: Exception) -> bytes:
        return _line(body)


def _line(item: dict[str, Any]) -> bytes:
    return json.dumps(item).encode() + b"\n"


async def _respond(request: Request, services: Services, kind: str, chat: ChatRequest,
                   body: _GenerationBody) -> Any:
    if body._debug_render_only:
        prompt = await pipeline.render_only(services, chat)
        out = _chunk(kind, chat.model, Delta()) | {"done": True}
        return Response(out | {"_debug_info": {"rendered_template": prompt.text, "image_count": len(prompt.media)}})

    async def whole(first: Delta | Final, events: AsyncIterator[Delta | Final]) -> dict[str, Any]:
        total, final = await pipeline.collect(first, events)
        out = _chunk(kind, chat.model, total)
        if not total.logprobs:
            out.pop("logprobs", None)
        return out | _final_fields(final)

    stream = _LineStream(request.url.path, kind, chat.model) if body.stream else None
    return await respond(request, services, chat, stream, whole)


@post("/api/generate", status_code=200, dependencies=json_body(GenerateBody))
async def generate(request: Request, services: Services, payload: GenerateBody) -> Any:
    if payload.suffix:
        raise BadRequest(f"model '{payload.model}' does not support insert")
    images = _images(payload.images)
    if images and payload.raw:
        raise BadRequest("a raw prompt has no place for images: the model's renderer places them; send them without raw")
    if images and not payload.prompt:
        raise BadRequest("images need a prompt to go with them")
    chat = ChatRequest(**_common(request, payload), system=payload.system,
                       messages=[] if not payload.prompt or payload.raw else [Message("user", payload.prompt, images=images)],
                       raw_prompt=payload.prompt if payload.raw and payload.prompt else None)
    if payload.template:
        raise BadRequest("a per-request template is not supported; set TEMPLATE in a Modelfile")
    return await _respond(request, services, "generate", chat, payload)


@post("/api/chat", status_code=200, dependencies=json_body(ChatBody))
async def chat(request: Request, services: Services, payload: ChatBody) -> Any:
    tools = [Tool(t.function.name, t.function.description, t.function.parameters) for t in payload.tools or []]
    messages = [_message(m) for m in payload.messages]
    chat_request = ChatRequest(**_common(request, payload), messages=messages, tools=tools)
    return await _respond(request, services, "chat", chat_request, payload)


ROUTES = [generate, chat]
