"""The path every dialect shares: resolve the model, render, acquire its runner, generate, parse."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import anyio
import attrs
from attrs import define, field

from plugd.builtins.jinja_renderer import FALLBACK_RENDERER
from plugd.chat.models import ResolvedModel, resolve
from plugd.chat.options import completion_body, resolve_options
from plugd.conversation import ConversationError, check_conversation
from plugd.hookspecs import ClientRenderer, ClientRequest, ParsedPiece, RenderRequest, StreamParser
from plugd.plugins import Registry
from plugd.scheduler.durations import parse_keep_alive
from plugd.scheduler.runner_client import RunnerProcess
from plugd.scheduler.scheduler import Scheduler
from plugd.settings import client_renderer_names
from plugd.store.names import ModelName
from plugd.store.store import Store
from plugd.types import Message, Prompt, Think, Tool, ToolCall


class InvalidRequest(ValueError):
    """The request cannot be served as asked (a 400 in every dialect)."""


class UnparseableOutput(RuntimeError):
    """The model's output does not follow its family's format; the generation was stopped."""


@define(frozen=True)
class ToolChoice:
    """Whether the model may, must or must not call a tool; `name` is the tool it must call in mode "named"."""

    mode: Literal["auto", "none", "required", "named"] = "auto"
    name: str | None = None


@define
class ChatRequest:
    """A dialect-neutral request: a conversation, or a raw prompt when `raw_prompt` is set."""

    model: str
    messages: list[Message] = field(factory=list)
    tools: list[Tool] = field(factory=list)
    tool_choice: ToolChoice = ToolChoice()
    think: Think = None
    options: dict[str, Any] = field(factory=dict)
    keep_alive: str | int | float | None = None
    format: Any = None  # "json" or a JSON Schema
    logprobs: bool = False
    top_logprobs: int = 0
    raw_prompt: str | None = None
    system: str | None = None  # replaces the model's SYSTEM
    dialect: Literal["ollama", "openai", "anthropic"] = "ollama"
    headers: dict[str, str] = field(factory=dict)


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
    prompt_tokens: int = 0  # the whole prompt, after truncation
    prompt_eval_count: int = 0  # prompt tokens evaluated: the reused prefix not included
    prompt_eval_duration: int = 0
    eval_count: int = 0
    eval_duration: int = 0
    load_duration: int = 0
    total_duration: int = 0

    @property
    def cached_tokens(self) -> int:
        return self.prompt_tokens - self.prompt_eval_count


@define
class Services:
    store: Store
    registry: Registry
    scheduler: Scheduler


def _conversation(model: ResolvedModel, request: ChatRequest) -> list[Message]:
    """The model's SYSTEM and MESSAGE preamble, then the request's messages, leading system turns folded into one.

    Agents send several system and developer messages before the first user
    turn; families have one system turn (and often no developer role), so the
    leading run is joined. System messages later on stay where they are.
    """
    messages = list(model.messages) + list(request.messages)
    leading = next((i for i, m in enumerate(messages) if m.role not in ("system", "developer")), len(messages))
    system = request.system if request.system is not None else model.system
    texts = [m.content for m in messages[:leading] if m.content]
    if not texts and system:
        texts = [system]
    head = [Message("system", "\n\n".join(texts))] if texts else []
    return head + messages[leading:]


RenderFunction = Callable[[RenderRequest], Prompt]


def _renderer(services: Services, model: ResolvedModel, request: ChatRequest) -> RenderFunction:
    """The model's renderer, or the first enabled client renderer that claims this request."""
    name = model.config.get("renderer") or FALLBACK_RENDERER
    renderer = services.registry.renderers().get(name)
    if renderer is None:
        raise InvalidRequest(f"model '{model.name}' uses renderer {name!r}, which no installed plugin provides")
    client = ClientRequest(request.dialect, request.headers, model.model_files, request.messages)
    for client_renderer in enabled_client_renderers(services.registry):
        if client_renderer.claims(client):
            return lambda render_request: client_renderer.render(render_request, renderer.render)  # noqa: B023
    return renderer.render


def _tools(request: ChatRequest) -> list[Tool]:
    return [] if request.tool_choice.mode == "none" else request.tools


def _render(render: RenderFunction, model: ResolvedModel, request: ChatRequest, messages: list[Message]) -> Prompt:
    try:
        prompt = render(RenderRequest(model.model_files, messages, _tools(request), request.think))
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    if prompt.media:
        raise InvalidRequest(f"model '{model.name}' does not support images")
    return prompt


async def _fitted_prompt(render: RenderFunction, model: ResolvedModel, request: ChatRequest, runner: RunnerProcess,
                         num_ctx: int) -> str:
    """The rendered conversation, dropping its oldest turns (never system ones, never the last) until it fits num_ctx.

    An assistant turn goes together with the tool results that answer it.
    """
    messages = _conversation(model, request)
    while True:
        prompt = _render(render, model, request, messages).text
        droppable = [i for i, m in enumerate(messages[:-1]) if m.role not in ("system", "developer", "tool")]
        if not droppable or len((await runner.post("/tokenize", {"text": prompt}))["tokens"]) <= num_ctx:
            return prompt
        end = droppable[0] + 1
        while end < len(messages) - 1 and messages[end].role == "tool":
            end += 1
        del messages[droppable[0]:end]


def _parser(services: Services, model: ResolvedModel, request: ChatRequest, prompt: str) -> StreamParser | None:
    name = model.config.get("parser")
    parser = services.registry.parsers().get(name) if name and request.raw_prompt is None else None
    if name and parser is None and request.raw_prompt is None:
        raise InvalidRequest(f"model '{model.name}' uses parser {name!r}, which no installed plugin provides")
    return parser.create(_tools(request), prompt) if parser else None


def _has_output(pieces: list[ParsedPiece]) -> bool:
    return any(p.text or p.tool_call for p in pieces)


def _delta(pieces: list[ParsedPiece], logprobs: list[dict[str, Any]]) -> Delta:
    delta = Delta(logprobs=logprobs)
    for piece in pieces:
        if piece.kind == "tool_call":
            delta.tool_calls.append(attrs.evolve(piece.tool_call, id=f"call_{secrets.token_hex(12)}"))
        elif piece.kind == "thinking":
            delta.thinking += piece.text
        else:
            delta.content += piece.text
    return delta


class _ContentOnly:
    """The parser of a model without one (or of a raw prompt): everything is content."""

    def feed(self, text: str) -> list[ParsedPiece]:
        return [ParsedPiece("content", text)]

    def finish(self) -> list[ParsedPiece]:
        return []


def _parsed(parse: Callable[[], list[ParsedPiece]]) -> list[ParsedPiece]:
    try:
        return parse()
    except ValueError as exc:
        raise UnparseableOutput(f"the model's output could not be parsed: {exc}") from None


def _grammar(services: Services, request: ChatRequest) -> dict[str, Any] | None:
    """The runner's grammar for a structured request, or a clear refusal; None for free text.

    A structured request is enforced token by token by a grammar engine
    plugin, or refused: never served as free text.
    """
    forced_call = request.tool_choice.mode in ("required", "named")
    if forced_call:
        if not request.tools:
            raise InvalidRequest(f"tool_choice {request.tool_choice.mode!r} needs tools")
        if request.tool_choice.name and request.tool_choice.name not in {t.name for t in request.tools}:
            raise InvalidRequest(f"tool_choice names {request.tool_choice.name!r}, which is not among the tools")
    structured = request.format not in (None, "")
    if not structured and not forced_call:
        return None
    wants = "structured output (format)" if structured else f"tool_choice {request.tool_choice.mode!r}"
    engines = services.registry.items.get("plugd_grammar_engines", [])
    if not engines:
        raise InvalidRequest(f"{wants} is not enforced by any installed plugin; install plugd-xgrammar")
    if forced_call:
        raise InvalidRequest(f"{wants} is not supported yet by the installed grammar engine")
    kind = "json" if request.format == "json" else "json_schema" if isinstance(request.format, dict) else None
    if kind is None:
        raise InvalidRequest(f'format must be "json" or a JSON Schema object, not {request.format!r}')
    engine = next((e for e in engines if kind in e.formats), None)
    if engine is None:
        raise InvalidRequest(f"no installed grammar engine enforces {kind} formats")
    return {"engine": engine.name, "factory": engine.factory, "kind": kind, "format": request.format}


async def _prepared(services: Services, request: ChatRequest) -> tuple[ResolvedModel, Any, dict[str, Any] | None]:
    try:
        keep_alive = parse_keep_alive(request.keep_alive)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    grammar = _grammar(services, request)
    try:
        check_conversation(request.messages, request.tools)
    except ConversationError as exc:
        raise InvalidRequest(str(exc)) from None
    model = await anyio.to_thread.run_sync(resolve, services.store, services.registry, ModelName.parse(request.model))
    return model, keep_alive, grammar


async def render_only(services: Services, request: ChatRequest) -> Prompt:
    """The prompt `request` would be given, without loading the model (and without fitting it to num_ctx)."""
    model, _, _ = await _prepared(services, request)
    if request.raw_prompt is not None:
        return Prompt(request.raw_prompt)
    return _render(_renderer(services, model, request), model, request, _conversation(model, request))


async def run(services: Services, request: ChatRequest) -> AsyncIterator[Delta | Final]:
    """Stream the response to `request`; a request with nothing to generate only loads (or unloads) the model."""
    started = time.perf_counter_ns()
    model, keep_alive, grammar = await _prepared(services, request)
    try:
        options = resolve_options(model.generation_config, model.parameters, request.options,
                                  model.config.get("context_length"))
    except ValueError as exc:
        raise InvalidRequest(f"invalid options: {exc}") from None
    load_only = not request.messages and not request.raw_prompt
    render = None if load_only or request.raw_prompt is not None else _renderer(services, model, request)

    async with services.scheduler.acquire(model, options.num_ctx, keep_alive) as loaded:
        load_duration = time.perf_counter_ns() - started
        if load_only:
            yield Final(done_reason="unload" if keep_alive == 0 else "load", load_duration=load_duration,
                        total_duration=time.perf_counter_ns() - started)
            return
        prompt = request.raw_prompt
        if render is not None:
            prompt = await _fitted_prompt(render, model, request, loaded.runner, options.num_ctx)
        parser = _parser(services, model, request, prompt) or _ContentOnly()
        body = completion_body(options, request.logprobs, request.top_logprobs) | {"prompt": prompt}
        if grammar is not None:
            body["grammar"] = grammar
        async for event in loaded.runner.completion(body):
            logprobs = [_logprob(event)] if request.logprobs and "token" in event else []
            text = event.get("text", "")
            if event["done"]:
                pieces = _parsed(lambda: parser.feed(text) + parser.finish())  # noqa: B023
                if _has_output(pieces):
                    yield _delta(pieces, [])
                yield Final(
                    done_reason=event["done_reason"],
                    prompt_tokens=event["prompt_tokens"],
                    prompt_eval_count=event["prompt_eval_count"],
                    prompt_eval_duration=event["prompt_eval_duration_ns"],
                    eval_count=event["eval_count"],
                    eval_duration=event["eval_duration_ns"],
                    load_duration=load_duration,
                    total_duration=time.perf_counter_ns() - started,
                )
                return
            pieces = _parsed(lambda: parser.feed(text))  # noqa: B023
            if logprobs or _has_output(pieces):
                yield _delta(pieces, logprobs)


def _logprob(event: dict[str, Any]) -> dict[str, Any]:
    return {
        "token": event["token_text"],
        "logprob": event["logprob"],
        "top_logprobs": [{"token": t, "logprob": lp} for t, lp in event.get("top_logprobs", [])],
    }


def enabled_client_renderers(registry: Registry) -> list[ClientRenderer]:
    """The client renderers named in PLUGD_CLIENT_RENDERERS, in that order (unknown names are skipped)."""
    available = {r.name: r for r in registry.items.get("plugd_client_renderers", [])}
    return [available[name] for name in client_renderer_names() if name in available]
