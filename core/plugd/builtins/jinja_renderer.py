"""Built-in renderer: the model's own Jinja chat template, rendered in a sandbox the way transformers does."""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from plugd.hookspecs import Renderer, RenderRequest, hookimpl
from plugd.types import Message, Prompt, Tool


class ChatTemplateError(ValueError):
    """The chat template failed to render, or raised on purpose (raise_exception)."""


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=32)
def _compile(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
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


def tool_dict(tool: Tool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


def special_token_text(value: Any) -> str:
    # tokenizer_config stores special tokens either as strings or as AddedToken dicts.
    if isinstance(value, dict):
        return value.get("content", "")
    return value or ""


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
        text = _compile(template).render(**context)
    except ChatTemplateError:
        raise
    except (TemplateError, TypeError, ValueError, LookupError, AttributeError) as exc:
        # A template that cannot handle this conversation (e.g. image parts in a text-only one) refuses it.
        raise ChatTemplateError(f"chat template error: {exc}") from exc
    images = [image for m in request.messages for image in m.images]
    return Prompt(text=text, media=images)


FALLBACK_RENDERER = "jinja"


@hookimpl
def plugd_renderers():
    # No `detect`: this is the fallback for a model no family renderer recognises, never a detected choice.
    return [Renderer(name=FALLBACK_RENDERER, render=render)]
