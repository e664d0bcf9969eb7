"""The path every dialect shares: resolve the model, render, acquire its runner, generate, parse."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Any

import anyio
import attrs
from attrs import define

from plugd.builtins.jinja_renderer import FALLBACK_RENDERER
from plugd.chat.fitting import Fitted, fitted
from plugd.chat.grammar import grammar_engines, structured
from plugd.chat.media_prep import MediaPreparer
from plugd.chat.models import ResolvedModel, resolve
from plugd.chat.options import completion, resolve_options
from plugd.chat.request import (
    ChatRequest,
    ContextExceeded,
    Delta,
    Final,
    InvalidRequest,
    Prefill,
    Queued,
    ToolChoice,
    UnparseableOutput,
)
from plugd.chat.tokens import encode, tokenizer_of
from plugd.hookspecs import ClientRenderer, ClientRequest, ParsedPiece, Parser, RenderRequest, StreamParser
from plugd.plugins import Registry
from plugd.protocol import Completion, DoneEvent, PrefillEvent, TokenEvent
from plugd.rendering import check_conversation
from plugd.scheduler.durations import parse_keep_alive
from plugd.scheduler.runner_client import RunnerProcess, RunnerRejected
from plugd.scheduler.scheduler import Scheduler
from plugd.settings import Settings
from plugd.store.names import ModelName
from plugd.store.store import Store
from plugd.types import Message, Options, Prompt, Tool

log = logging.getLogger(__name__)


@define
class Services:
    store: Store
    registry: Registry
    scheduler: Scheduler
    settings: Settings


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
    for client_renderer in enabled_client_renderers(services.registry, services.settings.client_renderers):
        if client_renderer.claims(client):
            return lambda render_request: client_renderer.render(render_request, renderer.render)  # noqa: B023
    return renderer.render


def _tools(request: ChatRequest) -> list[Tool]:
    return [] if request.tool_choice.mode == "none" else request.tools


async def _render(render: RenderFunction, model: ResolvedModel, request: ChatRequest, messages: list[Message],
                  preparer: MediaPreparer) -> Prompt:
    """The prompt of `messages`, its images in formats the model takes; rendered and converted in a worker thread,
    so that a slow template or a large image never holds the event loop (and every other request) up."""

    def rendered() -> Prompt:
        try:
            prompt = render(RenderRequest(model.model_files, messages, _tools(request), request.think))
        except ValueError as exc:
            raise InvalidRequest(f"model '{model.name}': {exc}") from None
        return Prompt(prompt.text, preparer.prepare(prompt.media))

    return await anyio.to_thread.run_sync(rendered)


async def _fitted_prompt(render: RenderFunction, model: ResolvedModel, request: ChatRequest, num_ctx: int,
                         preparer: MediaPreparer) -> Fitted:
    """The rendered conversation, fitted into num_ctx by dropping its oldest turns (plugd.chat.fitting) where the
    request truncates; a request that does not keeps every turn, and the runner refuses a prompt too long."""
    messages = _conversation(model, request)

    async def rendered(kept: list[Message]) -> Prompt:
        return await _render(render, model, request, kept, preparer)

    if not request.truncates:
        return Fitted(await rendered(messages))
    tokenizer = await anyio.to_thread.run_sync(tokenizer_of, model)
    return await fitted(messages, num_ctx, rendered, lambda prompt: encode(model, prompt), tokenizer)


def _parser(services: Services, model: ResolvedModel, request: ChatRequest) -> Parser | None:
    """The model's output parser; none for a raw prompt, whose output is all content."""
    name = model.config.get("parser")
    if not name or request.raw_prompt is not None:
        return None
    parser = services.registry.parsers().get(name)
    if parser is None:
        raise InvalidRequest(f"model '{model.name}' uses parser {name!r}, which no installed plugin provides")
    return parser


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


class _FirstCallOnly:
    """Enforces parallel_tool_calls=false: tool calls after the first one are dropped from the response."""

    def __init__(self, parser: StreamParser):
        self.parser = parser
        self.called = False

    def feed(self, text: str) -> list[ParsedPiece]:
        return self._kept(self.parser.feed(text))

    def finish(self) -> list[ParsedPiece]:
        return self._kept(self.parser.finish())

    def _kept(self, pieces: list[ParsedPiece]) -> list[ParsedPiece]:
        kept = []
        for piece in pieces:
            if piece.kind == "tool_call":
                if self.called:
                    continue
                self.called = True
            kept.append(piece)
        return kept


def _parsed(parse: Callable[[], list[ParsedPiece]]) -> list[ParsedPiece]:
    try:
        return parse()
    except ValueError as exc:
        raise UnparseableOutput(f"the model's output could not be parsed: {exc}") from None


@define(frozen=True)
class _Prepared:
    model: ResolvedModel
    options: Options
    keep_alive: float | None


async def _prepared(services: Services, request: ChatRequest) -> _Prepared:
    """The request checked, its model resolved and its options merged: all that can fail before a model loads."""
    try:
        keep_alive = parse_keep_alive(services.settings.keep_alive if request.keep_alive is None else request.keep_alive)
        check_conversation(request.messages, request.tools)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    model = await anyio.to_thread.run_sync(resolve, services.store, services.registry, ModelName.parse(request.model))
    if model.embeds and not _unloads(request, keep_alive):  # `plugd stop` unloads an embedding model too
        raise InvalidRequest(f"model '{model.name}' is an embedding model: it does not generate (ask /api/embed or "
                             "/v1/embeddings)")
    try:
        options = resolve_options(model.generation_config, model.parameters, request.options,
                                  model.config.get("context_length"), services.settings.context_length)
    except ValueError as exc:
        raise InvalidRequest(f"invalid options: {exc}") from None
    return _Prepared(model, options, keep_alive)


def _load_only(request: ChatRequest) -> bool:
    """Whether `request` has nothing to generate: it only loads its model, or unloads it (`_unloads`)."""
    return not request.messages and not request.raw_prompt


def _unloads(request: ChatRequest, keep_alive: float) -> bool:
    return _load_only(request) and keep_alive == 0


async def _whole_prompt(services: Services, model: ResolvedModel, request: ChatRequest) -> Prompt:
    if request.raw_prompt is not None:
        return Prompt(request.raw_prompt)
    return await _render(_renderer(services, model, request), model, request, _conversation(model, request),
                         _media_preparer(services, model))


def _media_preparer(services: Services, model: ResolvedModel) -> MediaPreparer:
    return MediaPreparer(services.registry, model.name, model.architecture if model.takes_images else None)


async def render_only(services: Services, request: ChatRequest) -> Prompt:
    """The prompt `request` would be given, without loading the model (and without fitting it to num_ctx)."""
    grammar_engines(services.registry, request, services.settings.grammar_engines)
    return await _whole_prompt(services, (await _prepared(services, request)).model, request)


async def count_tokens(services: Services, request: ChatRequest) -> int:
    """The tokens of the whole prompt `request` renders to, its images expanded: counted with the model's
    tokenizer, no model loaded.

    A forced tool call or an output format constrains decoding, not the
    prompt, so counting needs no grammar engine.
    """
    prepared = await _prepared(services, request)
    prompt = await _whole_prompt(services, prepared.model, request)
    return len((await encode(prepared.model, prompt)).tokens)


async def run(services: Services, request: ChatRequest,
              progress: bool = False) -> AsyncIterator[Queued | Prefill | Delta | Final]:
    """Stream the response to `request`; a request with nothing to generate only loads (or unloads) the model.

    With `progress`, events come before the output too: Queued when the request has to wait for the runner, then
    a Prefill once the runner has the prompt and starts on it, and one after each prefill chunk, so that a stream
    can open, and keep its client's idle timeout from firing, before the first token. Without, only Deltas and
    the Final."""
    started = time.perf_counter_ns()
    engines = grammar_engines(services.registry, request, services.settings.grammar_engines)
    prepared = await _prepared(services, request)
    model, options, keep_alive = prepared.model, prepared.options, prepared.keep_alive
    load_only = _load_only(request)
    if _unloads(request, keep_alive):  # as Ollama: an unload request does not load a model to unload it
        await services.scheduler.unload(model.digest)
        yield Final(done_reason="unload", total_duration=time.perf_counter_ns() - started)
        return
    render = None if load_only or request.raw_prompt is not None else _renderer(services, model, request)
    parser_kind = None if load_only else _parser(services, model, request)
    preparer = _media_preparer(services, model)
    images = [image for message in request.messages for image in message.images]
    await anyio.to_thread.run_sync(preparer.prepare, images)  # refused before a load
    if progress and services.scheduler.must_wait(model.digest, options.num_ctx):
        yield Queued()
    async with services.scheduler.acquire(model, options.num_ctx, keep_alive) as loaded:
        options = attrs.evolve(options, num_ctx=loaded.num_ctx)  # the model's default context when none was set
        load_duration = time.perf_counter_ns() - started
        if load_only:
            yield Final(done_reason="load", load_duration=load_duration,
                        total_duration=time.perf_counter_ns() - started)
            return
        prompt, media, encoded = request.raw_prompt, [], None
        if render is not None:
            fitted = await _fitted_prompt(render, model, request, options.num_ctx, preparer)
            prompt, media, encoded = fitted.prompt.text, fitted.prompt.media, fitted.encoded
            if log.isEnabledFor(logging.DEBUG):  # as Ollama's debug log does; one JSON string, on one line
                log.debug("prompt for %s: %s", model.name, json.dumps(prompt))
        parser = parser_kind.create(_tools(request), prompt) if parser_kind else _ContentOnly()
        if not request.parallel_tool_calls:
            parser = _FirstCallOnly(parser)
        body = completion(options, request.logprobs, request.top_logprobs, request.truncates)
        forced = None
        if engines:
            plan = structured(engines, request, parser_kind, prompt)
            body.grammar, forced = plan.grammar, plan.forced_call
        if forced is not None:  # the call is opened in the prompt; the parser reads it as the model's own
            _parsed(lambda: parser.feed(forced.prefix))
            encoded = None  # encoded with the call's opening
        if encoded is None:
            encoded = await encode(model, Prompt(prompt + (forced.prefix if forced is not None else ""), media))
        body.tokens, body.media = encoded.tokens, encoded.media
        token_text = (await anyio.to_thread.run_sync(tokenizer_of, model)).token_text  # a first use loads it
        images = {item.key: item.data for item in media}
        async with aclosing(_runner_events(loaded.runner, body, images, options.num_ctx)) as events:
            async for event in events:
                if isinstance(event, PrefillEvent):
                    if progress:
                        yield Prefill(event.prompt_tokens, event.cached_tokens, event.evaluated)
                    continue
                logprobs = [_logprob(event, token_text)] if request.logprobs and isinstance(event, TokenEvent) else []
                text = event.text
                if isinstance(event, DoneEvent):
                    closing = forced.suffix if forced is not None and event.done_reason == "stop" else None
                    if forced is not None and closing is None:
                        pieces = []  # the forced call was cut short (num_predict): no call, done_reason says why
                    else:
                        pieces = _parsed(lambda: parser.feed(text + (closing or "")) + parser.finish())  # noqa: B023
                    if _has_output(pieces):
                        yield _delta(pieces, [])
                    yield _final(event, load_duration, time.perf_counter_ns() - started)
                    return
                pieces = _parsed(lambda: parser.feed(text))  # noqa: B023
                if logprobs or _has_output(pieces):
                    yield _delta(pieces, logprobs)


async def _runner_events(runner: RunnerProcess, body: Completion, images: dict[str, bytes],
                         num_ctx: int) -> AsyncIterator[PrefillEvent | TokenEvent | DoneEvent]:
    """The runner's completion events; a prompt it refuses as longer than the context raises ContextExceeded."""
    try:
        async with aclosing(runner.completion(body, images)) as events:
            async for event in events:
                yield event
    except RunnerRejected as exc:
        if exc.details.get("kind") != "context_exceeded":
            raise
        raise ContextExceeded(exc.details["prompt_tokens"], exc.details["limit"], num_ctx) from None


def _final(done: DoneEvent, load_duration: int, total_duration: int) -> Final:
    """The pipeline's final event for the runner's last one: its counts, timings and reasons, and the load's."""
    carried = {name: value for name, value in attrs.asdict(done).items() if name in _FINAL_FIELDS}
    return Final(**carried, load_duration=load_duration, total_duration=total_duration)


_FINAL_FIELDS = frozenset(field.name for field in attrs.fields(Final))


async def drain(first: Delta | Final, events: AsyncIterator[Delta | Final], feed: Callable[[Delta], object]) -> Final:
    """Hand every delta to `feed` and return the final event; `events` is closed, releasing the runner, before
    this returns (a whole, non-streamed response goes out after that)."""
    event = first
    try:
        while not isinstance(event, Final):
            feed(event)
            event = await anext(events)
    finally:
        await events.aclose()
    return event


async def collect(first: Delta | Final, events: AsyncIterator[Delta | Final]) -> tuple[Delta, Final]:
    """The whole response: every delta joined, and the final event."""
    total = Delta()

    def join(delta: Delta) -> None:
        total.content += delta.content
        total.thinking += delta.thinking
        total.tool_calls += delta.tool_calls
        total.logprobs += delta.logprobs

    return total, await drain(first, events, join)


def _logprob(event: TokenEvent, token_text: Callable[[int], str]) -> dict[str, Any]:
    return {
        "token": token_text(event.token),
        "logprob": event.logprob,
        "top_logprobs": [{"token": token_text(t), "logprob": lp} for t, lp in event.top_logprobs],
    }


def enabled_client_renderers(registry: Registry, names: Sequence[str]) -> list[ClientRenderer]:
    """The client renderers `names` (PLUGD_CLIENT_RENDERERS) names, in that order (unknown names are skipped)."""
    available = {r.name: r for r in registry.items.get("plugd_client_renderers", [])}
    return [available[name] for name in names if name in available]


__all__ = ["ChatRequest", "ContextExceeded", "Delta", "Final", "InvalidRequest", "Prefill", "Queued", "Services",
           "ToolChoice", "UnparseableOutput", "collect", "count_tokens", "render_only", "run"]
