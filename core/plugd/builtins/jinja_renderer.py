"""Built-in renderer: the model's own Jinja chat template, rendered in a sandbox the way transformers does."""

from __future__ import annotations

import json
import re
import time
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

from plugd.hookspecs import Renderer, RenderRequest, hookimpl
from plugd.rendering import special_token_text, tool_dict
from plugd.types import Message, Prompt


class ChatTemplateError(ValueError):
    """The chat template failed to render, or raised on purpose (raise_exception)."""


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


# A render ends with an error past these: a template can loop for hours (nested ranges) or build a prompt no model
# could read, and either holds a worker and the model's slot meanwhile.
RENDER_SECONDS = 5.0
RENDER_CHARACTERS = 64 << 20
_deadline: ContextVar[float] = ContextVar("render_deadline", default=float("inf"))


def _check_deadline() -> None:
    if time.monotonic() > _deadline.get():
        raise ChatTemplateError(f"the chat template ran for more than {RENDER_SECONDS:g} s and was stopped")


def _timed_range(*args: int):
    """The sandbox's range, checking the render's deadline as a loop takes its items: a loop that writes
    nothing yields no output at which the deadline could otherwise be checked."""
    for index, value in enumerate(safe_range(*args)):
        if index % 4096 == 0:
            _check_deadline()
        yield value


class _Sandbox(ImmutableSandboxedEnvironment):
    """The sandbox, with `*` and `**` bounded: 'x' * 10**10 or 9 ** 10**9 would take the memory or the time at once."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for sequence, count in ((left, right), (right, left)):
                if isinstance(sequence, (str, list, tuple)) and isinstance(count, int) and \
                        len(sequence) * count > RENDER_CHARACTERS:
                    raise ChatTemplateError("the chat template builds a value too large to render")
        if operator == "**" and isinstance(right, int) and abs(right) > 1024 and isinstance(left, int) and \
                abs(left) > 1:
            raise ChatTemplateError("the chat template raises a number to a power too large to render")
        return super().call_binop(context, operator, left, right)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=32)
def _compile(source: str):
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["range"] = _timed_range
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


# Ollama's Modelfile templates are Go templates, whose fields start with a dot: {{ .Prompt }}, {{- .System }}.
_GO_TEMPLATE_FIELD = re.compile(r"\{\{-?\s*\.[A-Z]")


def check_template(source: str) -> None:
    """ValueError naming the problem when `source` does not compile as a Jinja chat template."""
    try:
        _compile(source)
    except TemplateSyntaxError as exc:
        hint = (" It looks like an Ollama Go template; plugd's TEMPLATE is a Jinja chat template, as in a model's "
                "tokenizer_config.json." if _GO_TEMPLATE_FIELD.search(source) else "")
        raise ValueError(f"TEMPLATE is not a valid Jinja template: {exc.message} (line {exc.lineno}).{hint}") from None


def message_dict(message: Message) -> dict[str, Any]:
    """A message in the shape Hugging Face chat templates read."""
    content: str | list[dict[str, Any]] = message.content
    if message.images:  # images first, then the text: the order plugd renders a message's parts in
        content = [{"type": "image"} for _ in message.images] + [{"type": "text", "text": message.content}]
    out: dict[str, Any] = {"role": message.role, "content": content}
    if message.thinking:
        out["reasoning_content"] = message.thinking
    if message.tool_calls:
        out["tool_calls"] = [
            {"type": "function", "id": c.id, "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.tool_name:
        out["name"] = message.tool_name
    return out


def render(request: RenderRequest) -> Prompt:
    template = request.model.chat_template
    if not template:
        raise ChatTemplateError("the model has no chat template")
    context: dict[str, Any] = {
        "messages": [message_dict(m) for m in request.messages],
        "add_generation_prompt": True,
        "bos_token": special_token_text(request.model.tokenizer_config.get("bos_token")),
        "eos_token": special_token_text(request.model.tokenizer_config.get("eos_token")),
    }
    if request.tools:
        context["tools"] = [tool_dict(t) for t in request.tools]
    if request.think is not None:
        context["enable_thinking"] = bool(request.think)
    try:
        text = _render_limited(_compile(template), context)
    except ChatTemplateError:
        raise
    except (TemplateError, TypeError, ValueError, LookupError, AttributeError, ArithmeticError, RecursionError) as exc:
        # A template that cannot handle this conversation (e.g. image parts in a text-only one) refuses it.
        raise ChatTemplateError(f"chat template error: {exc}") from exc
    images = [image for m in request.messages for image in m.images]
    return Prompt(text=text, media=images)


def _render_limited(template, context: dict[str, Any]) -> str:
    """The template's output, piece by piece, within RENDER_SECONDS and RENDER_CHARACTERS."""
    token = _deadline.set(time.monotonic() + RENDER_SECONDS)
    try:
        pieces, size = [], 0
        for piece in template.generate(**context):
            pieces.append(piece)
            size += len(piece)
            if size > RENDER_CHARACTERS:
                raise ChatTemplateError(f"the chat template wrote more than {RENDER_CHARACTERS >> 20} Mi characters")
            _check_deadline()
        return "".join(pieces)
    finally:
        _deadline.reset(token)


FALLBACK_RENDERER = "jinja"


@hookimpl
def plugd_renderers():
    # No `detect`: this is the fallback for a model no family renderer recognises, never a detected choice.
    return [Renderer(name=FALLBACK_RENDERER, render=render)]
