"""The path every dialect shares: resolve the model, render, acquire its runner, generate, parse."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from attrs import define, field

from plugd.chat.models import ResolvedModel, resolve
from plugd.chat.options import completion_body, resolve_options
from plugd.hookspecs import ParsedPiece, Renderer, RenderRequest, StreamParser
from plugd.plugins import Registry
from plugd.scheduler.durations import parse_keep_alive
from plugd.scheduler.runner_client import RunnerProcess
from plugd.scheduler.scheduler import Scheduler
from plugd.store.names import ModelName
from plugd.store.store import Store
from plugd.types import Message, Think, Tool, ToolCall


class InvalidRequest(ValueError):
    """The request cannot be served as asked (a 400 in every dialect)."""


@define
class ChatRequest:
    """A dialect-neutral request: a conversation, or a raw prompt when `raw_prompt` is set."""

    model: str
    messages: list[Message] = field(factory=list)
    tools: list[Tool] = field(factory=list)
    think: Think = None
    options: dict[str, Any] = field(factory=dict)
    keep_alive: str | int | float | None = None
    format: Any = None
    logprobs: bool = False
    top_logprobs: int = 0
    raw_prompt: str | None = None
    system: str | None = None  # replaces the model's SYSTEM


@define
class Delta:
    """A piece of the response as it streams."""

    content: str = ""
    thinking: str = ""
    tool_calls: list[ToolCall] = field(factory=list)
    logprobs: list[dict[str, Any]] = field(factory=list)


@define
class Final:
    done_reason: str
    prompt_eval_count: int = 0
    prompt_eval_duration: int = 0
    eval_count: int = 0
    eval_duration: int = 0
    load_duration: int = 0
    total_duration: int = 0


@define
class Services:
    store: Store
    registry: Registry
    scheduler: Scheduler


def _conversation(model: ResolvedModel, request: ChatRequest) -> list[Message]:
    """The model's SYSTEM and MESSAGE preamble, then the request's messages."""
    messages = list(request.messages)
    has_system = bool(messages) and messages[0].role in ("system", "developer")
    system = request.system if request.system is not None else model.system
    preamble = [Message("system", system)] if system and not has_system else []
    return preamble + model.messages + messages


def _renderer(services: Services, model: ResolvedModel) -> Renderer:
    name = model.config.get("renderer") or "jinja"
    renderer = services.registry.renderers().get(name)
    if renderer is None:
        raise InvalidRequest(f"model '{model.name}' uses renderer {name!r}, which no installed plugin provides")
    return renderer


def _render(renderer: Renderer, model: ResolvedModel, request: ChatRequest, messages: list[Message]) -> str:
    try:
        return renderer.render(RenderRequest(model.model_files, messages, request.tools, request.think)).text
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


async def _fitted_prompt(renderer: Renderer, model: ResolvedModel, request: ChatRequest, runner: RunnerProcess,
                         num_ctx: int) -> str:
    """The rendered conversation, dropping its oldest turns (never system ones, never the last) until it fits num_ctx."""
    messages = _conversation(model, request)
    while True:
        prompt = _render(renderer, model, request, messages)
        droppable = [i for i, m in enumerate(messages[:-1]) if m.role not in ("system", "developer")]
        if not droppable or len((await runner.post("/tokenize", {"text": prompt}))["tokens"]) <= num_ctx:
            return prompt
        del messages[droppable[0]]


def _parser(services: Services, model: ResolvedModel, request: ChatRequest) -> StreamParser | None:
    name = model.config.get("parser")
    parser = services.registry.parsers().get(name) if name and request.raw_prompt is None else None
    return parser.create(request.tools, bool(request.think)) if parser else None


def _has_output(pieces: list[ParsedPiece]) -> bool:
    return any(p.text or p.tool_call for p in pieces)


def _delta(pieces: list[ParsedPiece], logprobs: list[dict[str, Any]]) -> Delta:
    delta = Delta(logprobs=logprobs)
    for piece in pieces:
        if piece.kind == "tool_call":
            delta.tool_calls.append(piece.tool_call)
        elif piece.kind == "thinking":
            delta.thinking += piece.text
        else:
            delta.content += piece.text
    return delta


def _check_supported(services: Services, request: ChatRequest) -> None:
    if request.format not in (None, ""):
        engines = services.registry.items.get("plugd_grammar_engines", [])
        raise InvalidRequest(
            "structured output (format) is not enforced by any installed plugin; install plugd-xgrammar"
            if not engines else "structured output (format) is not supported yet"
        )


async def run(services: Services, request: ChatRequest) -> AsyncIterator[Delta | Final]:
    """Stream the response to `request`; a request with nothing to generate only loads (or unloads) the model."""
    started = time.perf_counter_ns()
    try:
        keep_alive = parse_keep_alive(request.keep_alive)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    _check_supported(services, request)
    name = ModelName.parse(request.model)
    model = await anyio.to_thread.run_sync(resolve, services.store, services.registry, name)
    try:
        options = resolve_options(model.generation_config, model.parameters, request.options,
                                  model.config.get("context_length"))
    except ValueError as exc:
        raise InvalidRequest(f"invalid options: {exc}") from None
    load_only = not request.messages and not request.raw_prompt
    renderer = None if load_only or request.raw_prompt is not None else _renderer(services, model)
    parser = None if load_only else _parser(services, model, request)

    async with services.scheduler.acquire(model, options.num_ctx, keep_alive) as loaded:
        load_duration = time.perf_counter_ns() - started
        if load_only:
            yield Final(done_reason="unload" if keep_alive == 0 else "load", load_duration=load_duration,
                        total_duration=time.perf_counter_ns() - started)
            return
        prompt = request.raw_prompt
        if renderer is not None:
            prompt = await _fitted_prompt(renderer, model, request, loaded.runner, options.num_ctx)
        body = completion_body(options, request.logprobs, request.top_logprobs) | {"prompt": prompt}
        async for event in loaded.runner.completion(body):
            logprobs = [_logprob(event)] if request.logprobs and "token" in event else []
            text = event.get("text", "")
            if event["done"]:
                pieces = (parser.feed(text) + parser.finish()) if parser else [ParsedPiece("content", text)]
                if _has_output(pieces):
                    yield _delta(pieces, [])
                yield Final(
                    done_reason=event["done_reason"],
                    prompt_eval_count=event["prompt_eval_count"],
                    prompt_eval_duration=event["prompt_eval_duration_ns"],
                    eval_count=event["eval_count"],
                    eval_duration=event["eval_duration_ns"],
                    load_duration=load_duration,
                    total_duration=time.perf_counter_ns() - started,
                )
                return
            pieces = parser.feed(text) if parser else [ParsedPiece("content", text)]
            if logprobs or _has_output(pieces):
                yield _delta(pieces, logprobs)


def _logprob(event: dict[str, Any]) -> dict[str, Any]:
    return {
        "token": event["token_text"],
        "logprob": event["logprob"],
        "top_logprobs": [{"token": t, "logprob": lp} for t, lp in event.get("top_logprobs", [])],
    }
