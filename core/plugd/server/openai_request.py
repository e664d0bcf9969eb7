"""OpenAI /v1/chat/completions and /v1/completions bodies, translated into the pipeline's ChatRequest."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from attrs import define
from litestar import Request

from plugd.chat.pipeline import ChatRequest
from plugd.server import openai_messages
from plugd.server.bodies import BadRequest, read_body
from plugd.types import Think, structure

T = TypeVar("T")
MAX_TOP_LOGPROBS = 20

# Fields plugd cannot honour, with the values that would change the response; each is refused with a 400 naming it.
# Fields with no effect on the response (user, metadata, service_tier, store false, prompt_cache_key...) are ignored.
_REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "logit_bias": (bool, "logit_bias is not supported"),
    "audio": (lambda v: v is not None, "audio output is not supported"),
    "modalities": (lambda v: isinstance(v, list) and "audio" in v, "modalities: audio output is not supported"),
    "prediction": (lambda v: v is not None, "prediction (predicted outputs) is not supported"),
    "functions": (lambda v: v is not None, "functions (legacy) is not supported; use tools"),
    "function_call": (lambda v: v is not None, "function_call (legacy) is not supported; use tool_choice"),
    "web_search_options": (lambda v: v is not None, "web_search_options is not supported"),
    "moderation": (lambda v: v is not None, "moderation is not supported"),
    "store": (lambda v: v is True, "store true is not supported: plugd does not store completions"),
    "suffix": (bool, "suffix is not supported: the model does not support insert"),
    "echo": (bool, "echo is not supported"),
    "best_of": (lambda v: v not in (None, 1), "best_of > 1 is not supported"),
}
# OpenAI's reasoning_effort as plugd's think: the levels plugd knows, thinking off for the lowest ones.
_EFFORT: dict[str, Think] = {"none": False, "minimal": False, "low": "low", "medium": "medium", "high": "high",
                             "xhigh": "high"}


@define(kw_only=True)
class StreamOptions:
    include_usage: bool = False


@define(kw_only=True)
class _GenerationBody:
    """The fields /v1/chat/completions and /v1/completions share."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    n: int | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage


@define(kw_only=True)
class ChatBody(_GenerationBody):
    messages: Any = None
    max_completion_tokens: int | None = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


@define(kw_only=True)
class CompletionBody(_GenerationBody):
    prompt: str | list[str] | None = None
    logprobs: int | None = None


async def read(request: Request, cls: type[T]) -> T:
    """The body as `cls`, once every field that would change the response and cannot be honoured is refused."""
    data = await read_body(request, dict[str, Any])
    for name, (refused, message) in _REFUSED.items():
        if name in data and refused(data[name]):
            raise BadRequest(message)
    try:
        return structure(data, cls)
    except ValueError as exc:
        raise BadRequest(f"invalid request body: {exc}") from None


def _options(body: _GenerationBody, max_tokens: int | None) -> dict[str, Any]:
    if body.n is not None and body.n != 1:
        raise BadRequest("n > 1 is not supported" if body.n > 1 else "n must be 1")
    if max_tokens is not None and max_tokens < 1:
        raise BadRequest("max_tokens must be at least 1")
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    options = {"num_predict": max_tokens, "temperature": body.temperature, "top_p": body.top_p, "seed": body.seed,
               "stop": stop, "frequency_penalty": body.frequency_penalty, "presence_penalty": body.presence_penalty}
    return {name: value for name, value in options.items() if value is not None}


def _format(response_format: dict[str, Any] | None) -> Any:
    """Ollama's `format` for a response_format: "json", a JSON Schema (always enforced, strict or not), or None."""
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return "json"
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise BadRequest("response_format.json_schema.schema must be an object")
        return schema or "json"
    raise BadRequest(f"response_format type {kind!r} is not supported")


def _think(effort: str | None) -> Think:
    if effort is None:
        return None
    if effort not in _EFFORT:
        raise BadRequest(f"reasoning_effort {effort!r} is not supported; use one of {', '.join(_EFFORT)}")
    return _EFFORT[effort]


def _top_logprobs(logprobs: bool, top_logprobs: int | None) -> int:
    if top_logprobs is None:
        return 0
    if not logprobs:
        raise BadRequest("top_logprobs needs logprobs")
    if not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
        raise BadRequest(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}")
    return top_logprobs


def _headers(request: Request) -> dict[str, str]:
    return {name.lower(): value for name, value in request.headers.items()}


def chat_request(request: Request, body: ChatBody) -> ChatRequest:
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return ChatRequest(
        model=body.model,
        messages=openai_messages.messages(body.messages),
        tools=openai_messages.tools(body.tools),
        tool_choice=openai_messages.tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        think=_think(body.reasoning_effort),
        options=_options(body, max_tokens),
        format=_format(body.response_format),
        logprobs=bool(body.logprobs),
        top_logprobs=_top_logprobs(bool(body.logprobs), body.top_logprobs),
        dialect="openai",
        headers=_headers(request),
    )


def completion_request(request: Request, body: CompletionBody) -> ChatRequest:
    """A raw completion of the prompt: no chat template is applied."""
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise BadRequest("prompt must be a string or a list of exactly one string")
        (prompt,) = prompt
    if not prompt:
        raise BadRequest("prompt must not be empty")
    logprobs = body.logprobs is not None
    return ChatRequest(
        model=body.model,
        raw_prompt=prompt,
        options=_options(body, body.max_tokens),
        logprobs=logprobs,
        top_logprobs=_top_logprobs(logprobs, body.logprobs),
        dialect="openai",
        headers=_headers(request),
    )
