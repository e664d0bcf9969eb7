"""The Responses API's input items, read into plugd Messages.

`instructions` becomes a leading system message; consecutive reasoning,
assistant message, function_call and custom_tool_call items become one
assistant turn (its thinking, content and tool calls), as one response's
output is one turn of the model; a function_call_output or
custom_tool_call_output becomes a tool message named after the call it
answers. A reasoning item's `encrypted_content` (OpenAI's, which plugd cannot
read, or null as Codex sends it for other providers) is ignored: its text,
else its summary, is the turn's thinking. A call's `namespace` needs no
translation: the model was offered the namespace's tools under their own names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plugd.media import data_url_image
from plugd.parsing import parse_json_arguments
from plugd.server.bodies import BadRequest
from plugd.server.openai_responses_tools import CUSTOM_INPUT
from plugd.types import Media, Message, ToolCall

NOT_STORED = "plugd does not store responses; send the whole conversation as input"


def string_field(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise BadRequest(f"{where} needs {key!r} as a string")
    return value


def _image(part: dict[str, Any]) -> Media:
    if part.get("file_id"):
        raise BadRequest("input_image by file_id is not supported: plugd has no file store; send a data: URL")
    try:
        return data_url_image(string_field(part, "image_url", "input_image"))
    except ValueError as exc:
        raise BadRequest(f"input_image: {exc}") from None


def _content(content: Any, where: str) -> tuple[str, list[Media]]:
    """The text (parts joined as a chat template joins them: back to back) and images of a message's content."""
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content parts")
    texts: list[str] = []
    images: list[Media] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text"):
            texts.append(string_field(part, "text", kind))
        elif kind == "input_image":
            images.append(_image(part))
        else:
            raise BadRequest(f"content part type {kind!r} is not supported")
    return "".join(texts), images


def _part_texts(parts: Any, where: str) -> list[str]:
    if parts is None:
        return []
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        raise BadRequest(f"{where} must be a list of parts")
    return [string_field(p, "text", where) for p in parts]


class _InputReader:
    """Turns input items into plugd Messages, one assistant turn from each run of assistant-side items."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self._turn: Message | None = None  # the assistant turn that following assistant-side items add to
        self._call_names: dict[str, str] = {}
        self._readers: dict[str, Callable[[dict[str, Any]], None]] = {
            "message": self._message,
            "reasoning": self._reasoning,
            "function_call": self._function_call,
            "custom_tool_call": self._custom_tool_call,
            "function_call_output": self._call_output,
            "custom_tool_call_output": self._call_output,
        }

    def read(self, item: dict[str, Any]) -> None:
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "item_reference":
            raise BadRequest(f"item_reference is not supported: {NOT_STORED}")
        reader = self._readers.get(kind)
        if reader is None:
            raise BadRequest(f"input item type {kind!r} is not supported")
        reader(item)

    def _assistant_turn(self, fresh: bool) -> Message:
        if self._turn is None or fresh:
            self._turn = Message("assistant")
            self.messages.append(self._turn)
        return self._turn

    def _message(self, item: dict[str, Any]) -> None:
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise BadRequest(f"invalid message role {role!r}")
        text, images = _content(item.get("content"), "message content")
        if role == "assistant":
            turn = self._assistant_turn(fresh=bool(self._turn and (self._turn.content or self._turn.tool_calls)))
            turn.content, turn.images = text, turn.images + images
        else:
            self._turn = None
            self.messages.append(Message(role, text, images=images))

    def _reasoning(self, item: dict[str, Any]) -> None:
        """The raw reasoning text when the item has it, else its summary."""
        text = "".join(_part_texts(item.get("content"), "reasoning content"))
        text = text or "\n\n".join(_part_texts(item.get("summary"), "reasoning summary"))
        turn = self._assistant_turn(fresh=bool(self._turn and (self._turn.content or self._turn.tool_calls
                                                               or self._turn.thinking)))
        turn.thinking = text or None

    def _call(self, call_id: str, call: ToolCall) -> None:
        self._call_names[call_id] = call.name
        self._assistant_turn(fresh=False).tool_calls.append(call)

    def _function_call(self, item: dict[str, Any]) -> None:
        call_id, name = string_field(item, "call_id", "function_call"), string_field(item, "name", "function_call")
        arguments = item.get("arguments", "")
        if not isinstance(arguments, str):
            raise BadRequest("function_call arguments must be a JSON string")
        try:
            parsed = parse_json_arguments(arguments, name)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        self._call(call_id, ToolCall(name, parsed, id=call_id))

    def _custom_tool_call(self, item: dict[str, Any]) -> None:
        call_id = string_field(item, "call_id", "custom_tool_call")
        name, text = string_field(item, "name", "custom_tool_call"), string_field(item, "input", "custom_tool_call")
        self._call(call_id, ToolCall(name, {CUSTOM_INPUT: text}, id=call_id))

    def _call_output(self, item: dict[str, Any]) -> None:
        kind = item["type"]
        call_id = string_field(item, "call_id", kind)
        name = self._call_names.get(call_id)
        if name is None:
            raise BadRequest(f"{kind} call_id {call_id!r} answers no earlier {kind.removesuffix('_output')}")
        text, images = _content(item.get("output"), f"{kind} output")
        self._turn = None
        self.messages.append(Message("tool", text, images=images, tool_name=name, tool_call_id=call_id))


def input_messages(input_value: Any, instructions: str | None) -> list[Message]:
    """The conversation of a request's `input` (a string, or a list of items) after its `instructions`."""
    items = [{"role": "user", "content": input_value}] if isinstance(input_value, str) else input_value
    if not isinstance(items, list) or not items:
        raise BadRequest("input must be a string or a non-empty list of items")
    reader = _InputReader()
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{index}] must be an object")
        try:
            reader.read(item)
        except BadRequest as exc:
            raise BadRequest(f"input[{index}]: {exc}") from None
    head = [Message("system", instructions)] if instructions else []
    return head + reader.messages
