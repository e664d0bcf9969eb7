"""What renderer plugins build on: the checks every renderer can rely on (well-formed tools, tool results that
answer an earlier call) and the values chat templates are given (tools as OpenAI-style dicts, special tokens).

Renderer and parser plugins import from here, `plugd.parsing`, `plugd.hookspecs`, `plugd.types` and
`plugd.testing`, and from nothing else of plugd's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plugd.types import Message, Tool, ToolCall

ROLES = ("system", "developer", "user", "assistant", "tool")


class ConversationError(ValueError):
    """A conversation no renderer could render faithfully."""


def check_conversation(messages: Sequence[Message], tools: Sequence[Tool]) -> None:
    """Refuse unknown roles, malformed tools, and tool results that answer no call.

    A tool result is matched to an earlier assistant call by tool_call_id when
    it has one, else by tool_name, else it needs any earlier call.
    """
    _check_tools(tools)
    calls: list[ToolCall] = []
    for message in messages:
        if message.role not in ROLES:
            raise ConversationError(f"invalid message role {message.role!r} (roles are {', '.join(ROLES)})")
        calls += message.tool_calls
        if message.role == "tool" and not _answers(message, calls):
            which = message.tool_call_id or message.tool_name
            label = f"tool result {which!r}" if which else "a tool result without a name or id"
            raise ConversationError(f"{label} answers no earlier tool call")


def _check_tools(tools: Sequence[Tool]) -> None:
    names = [t.name for t in tools]
    for tool in tools:
        if not tool.name or any(c.isspace() for c in tool.name):
            raise ConversationError(f"invalid tool name {tool.name!r}")
        schema = tool.parameters
        if not isinstance(schema, dict) or schema.get("type", "object") != "object" or \
                not isinstance(schema.get("properties", {}), dict):
            raise ConversationError(f"the parameters of tool {tool.name!r} must be a JSON Schema of type object")
    if len(set(names)) != len(names):
        raise ConversationError("tool names must be unique")


def _answers(result: Message, calls: list[ToolCall]) -> bool:
    if result.tool_call_id is not None:
        return any(call.id == result.tool_call_id for call in calls)
    if result.tool_name is not None:
        return any(call.name == result.tool_name for call in calls)
    return bool(calls)


def tool_dict(tool: Tool) -> dict[str, Any]:
    """A tool as chat templates take it: OpenAI's function-tool shape."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


def special_token_text(value: Any) -> str:
    """A special token's text from tokenizer_config, which stores it as a string or as an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content", "")
    return value or ""
