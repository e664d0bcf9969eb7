"""The dialect-neutral request, the events its response streams as, and the errors every dialect maps."""

from __future__ import annotations

from typing import Any, Literal

from attrs import define, field

from plugd.errors import PlugdError
from plugd.types import Message, Think, Tool, ToolCall


class InvalidRequest(PlugdError, ValueError):
    """The request cannot be served as asked (a 400 in every dialect)."""

    status = 400


class ContextExceeded(InvalidRequest):
    """The prompt does not fit the context, in a dialect that refuses it rather than truncates it (a 400 that each
    dialect words as its API does)."""

    def __init__(self, prompt_tokens: int, limit: int, context_length: int):
        super().__init__(f"the prompt is {prompt_tokens} tokens; a context of {context_length} holds {limit}")
        self.prompt_tokens = prompt_tokens
        self.limit = limit  # the most prompt tokens the context holds: one place is left for the output
        self.context_length = context_length


class UnparseableOutput(PlugdError, RuntimeError):
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
    parallel_tool_calls: bool = True  # False: at most one tool call per response
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

    @property
    def truncates(self) -> bool:
        """Whether a prompt over num_ctx is cut to fit, as Ollama cuts it (its oldest turns dropped, then its tokens),
        rather than refused with ContextExceeded, as the OpenAI and Anthropic APIs refuse it."""
        return self.dialect == "ollama"


@define
class Queued:
    """The request waits for its model's runner (busy with other requests, or behind another model's load): sent
    as it starts waiting, so that a stream opens then. Only `run(..., progress=True)`."""


@define
class Prefill:
    """How far the prompt's prefill is, sent before any output: once as it starts (evaluated 0: a stream's opening
    events), then after each chunk (a keep-alive while no token comes). Only `run(..., progress=True)`."""

    prompt_tokens: int
    cached_tokens: int  # read from the prompt cache: restored, not evaluated
    evaluated: int = 0


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
    stop_sequence: str | None = None  # the stop string that ended the output, when one did
    context_full: bool = False  # done_reason "length" because prompt and output filled num_ctx, not num_predict

    @property
    def cached_tokens(self) -> int:
        return self.prompt_tokens - self.prompt_eval_count
