"""OpenAI chat messages, tools and tool_choice, translated into plugd's Message, Tool and ToolChoice."""

from __future__ import annotations

import json
from typing import Any

from plugd.chat.pipeline import ToolChoice
from plugd.media import data_url_image
from plugd.server.bodies import BadRequest
from plugd.types import Media, Message, Tool, ToolCall


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be an object")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{where} must be a string")
    return value


def _content(value: Any, where: str, part_types: tuple[str, ...]) -> tuple[str, list[Media]]:
    """Text and images of a message's content: a string, or a list of parts of the given types.

    Text parts are joined back to back, as Hugging Face chat templates join the parts of a list content.
    """
    if value is None:
        return "", []
    if isinstance(value, str):
        return value, []
    if not isinstance(value, list):
        raise BadRequest(f"{where} must be a string or a list of content parts")
    texts, images = [], []
    for i, part in enumerate(value):
        at = f"{where}[{i}]"
        kind = _object(part, at).get("type")
        if kind not in part_types:
            raise BadRequest(f"{at}: content part type {kind!r} is not supported here (expected {' or '.join(part_types)})")
        if kind == "image_url":
            images.append(_image(part, at))
        else:
            texts.append(_string(part.get(kind), f"{at}.{kind}"))
    return "".join(texts), images


def _image(part: dict[str, Any], where: str) -> Media:
    url = _object(part.get("image_url"), f"{where}.image_url").get("url")
    try:
        return data_url_image(_string(url, f"{where}.image_url.url"))
    except ValueError as exc:
        raise BadRequest(f"{where}: {exc}") from None


def _arguments(value: Any, where: str) -> dict[str, Any]:
    try:
        arguments = json.loads(_string(value, where))
    except json.JSONDecodeError as exc:
        raise BadRequest(f"{where} is not valid JSON: {exc}") from None
    return _object(arguments, f"{where} (decoded)")


def _tool_calls(value: Any, where: str) -> list[ToolCall]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequest(f"{where} must be a list")
    calls = []
    for i, call in enumerate(value):
        at = f"{where}[{i}]"
        if _object(call, at).get("type", "function") != "function":
            raise BadRequest(f"{at}: tool call type {call['type']!r} is not supported")
        function = _object(call.get("function"), f"{at}.function")
        name = _string(function.get("name"), f"{at}.function.name")
        call_id = call.get("id")
        calls.append(ToolCall(name, _arguments(function.get("arguments"), f"{at}.function.arguments"),
                              id=None if call_id is None else _string(call_id, f"{at}.id")))
    return calls


def messages(value: Any) -> list[Message]:
    """The conversation; a tool message is named after the call (of an earlier assistant message) it answers.

    A tool message that answers no call is left for the pipeline to refuse.
    """
    if not isinstance(value, list) or not value:
        raise BadRequest("messages must be a non-empty list")
    out: list[Message] = []
    call_names: dict[str, str] = {}
    for i, raw in enumerate(value):
        where = f"messages[{i}]"
        role = _object(raw, where).get("role")
        content = raw.get("content")
        if role in ("system", "developer"):
            text, _ = _content(content, f"{where}.content", ("text",))
            out.append(Message(role, text))
        elif role == "user":
            text, images = _content(content, f"{where}.content", ("text", "image_url"))
            out.append(Message("user", text, images=images))
        elif role == "assistant":
            text, _ = _content(content, f"{where}.content", ("text", "refusal"))
            calls = _tool_calls(raw.get("tool_calls"), f"{where}.tool_calls")
            call_names |= {c.id: c.name for c in calls if c.id is not None}
            thinking = raw.get("reasoning_content") or raw.get("reasoning")
            out.append(Message("assistant", text, tool_calls=calls,
                               thinking=None if thinking is None else _string(thinking, f"{where}.reasoning_content")))
        elif role == "tool":
            text, _ = _content(content, f"{where}.content", ("text",))
            call_id = _string(raw.get("tool_call_id"), f"{where}.tool_call_id")
            out.append(Message("tool", text, tool_call_id=call_id, tool_name=call_names.get(call_id)))
        elif role == "function":
            raise BadRequest(f"{where}: the legacy 'function' role is not supported; use tool messages")
        else:
            raise BadRequest(f"{where}: invalid message role {role!r}")
    return out


def tools(value: Any) -> list[Tool]:
    """Function tools, in the OpenAI shape; the pipeline checks their names and schemas for every dialect."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequest("tools must be a list")
    out: list[Tool] = []
    for i, raw in enumerate(value):
        where = f"tools[{i}]"
        if _object(raw, where).get("type") != "function":
            raise BadRequest(f"{where}: tool type {raw.get('type')!r} is not supported; only 'function' tools are")
        function = _object(raw.get("function"), f"{where}.function")
        description = function.get("description")
        out.append(Tool(_string(function.get("name"), f"{where}.function.name"),
                        "" if description is None else _string(description, f"{where}.function.description"),
                        _object(function.get("parameters", {}), f"{where}.function.parameters")))
    return out


def tool_choice(value: Any) -> ToolChoice:
    """"none", "auto", "required", or {"type": "function", "function": {"name": ...}}."""
    if value is None:
        return ToolChoice()
    if value in ("none", "auto", "required"):
        return ToolChoice(value)
    if isinstance(value, dict) and value.get("type") == "function":
        function = _object(value.get("function"), "tool_choice.function")
        return ToolChoice("named", _string(function.get("name"), "tool_choice.function.name"))
    raise BadRequest(f"tool_choice {value!r} is not supported; use 'none', 'auto', 'required' or a named function")
