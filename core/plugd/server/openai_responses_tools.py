"""The Responses API's tools: what the model is offered from a request's `tools`, and the items its calls become.

- A function tool is offered as it is; its calls come back as function_call items.
- A custom tool (free-form text input, as Codex's apply_patch) is offered as a function of one string parameter,
  `input`; its calls come back as custom_tool_call items carrying that text.
- A namespace (a named group of function and custom tools, as Codex's multi_agent_v1) is offered as its members,
  under their own names; their calls come back naming the namespace, which is how a client routes them.
- A hosted tool runs on OpenAI's servers (web search, file search, code interpreter, computer use, image
  generation, remote MCP): plugd cannot run one, so it is left out of what the model is offered, with one log
  line, and refused only when tool_choice forces it.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

from attrs import define

from plugd.chat.pipeline import ToolChoice
from plugd.server.bodies import BadRequest
from plugd.types import Tool, ToolCall

log = logging.getLogger(__name__)

HOSTED_TOOLS = frozenset({
    "web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11", "file_search",
    "code_interpreter", "computer", "computer_use_preview", "image_generation", "mcp",
})
CUSTOM_INPUT = "input"  # the one parameter a custom tool is offered with


@define(frozen=True)
class OfferedTool:
    tool: Tool
    kind: Literal["function", "custom"]
    namespace: str | None = None


def _string(tool: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = tool.get(key, default)
    if not isinstance(value, str):
        raise BadRequest(f"{where} needs {key!r} as a string")
    return value


def _function(tool: dict[str, Any], namespace: str | None) -> OfferedTool:
    description, parameters = tool.get("description") or "", tool.get("parameters") or {}
    if not isinstance(description, str) or not isinstance(parameters, dict):
        raise BadRequest("a function tool's description must be a string and its parameters a JSON Schema object")
    return OfferedTool(Tool(_string(tool, "name", "a function tool"), description, parameters), "function", namespace)


def _custom(tool: dict[str, Any], namespace: str | None) -> OfferedTool:
    name = _string(tool, "name", "a custom tool")
    description = _string(tool, "description", "a custom tool", default="")
    text_format = tool.get("format") or {"type": "text"}
    if not isinstance(text_format, dict) or text_format.get("type") not in ("text", "grammar"):
        raise BadRequest(f"custom tool {name!r}: format must be text or grammar")
    about = "The text to pass to the tool."
    if text_format["type"] == "grammar":  # the model is told the grammar; nothing enforces it
        about += (f" It must follow this {_string(text_format, 'syntax', 'a grammar format')} grammar:\n"
                  + _string(text_format, "definition", "a grammar format"))
    parameters = {"type": "object", "properties": {CUSTOM_INPUT: {"type": "string", "description": about}},
                  "required": [CUSTOM_INPUT]}
    return OfferedTool(Tool(name, description, parameters), "custom", namespace)


def _namespace(tool: dict[str, Any]) -> list[OfferedTool]:
    name = _string(tool, "name", "a namespace tool")
    members = tool.get("tools")
    if not isinstance(members, list) or not all(isinstance(member, dict) for member in members):
        raise BadRequest(f"namespace {name!r} needs 'tools' as a list of function and custom tools")
    readers = {"function": _function, "custom": _custom}
    offered = []
    for member in members:
        reader = readers.get(member.get("type"))
        if reader is None:
            raise BadRequest(f"namespace {name!r}: tool type {member.get('type')!r} is not supported in a namespace")
        offered.append(reader(member, name))
    return offered


class ResponsesTools:
    """The tools of one request, by the name the model calls them by."""

    def __init__(self, tools: list[dict[str, Any]] | None):
        self.offered: dict[str, OfferedTool] = {}
        left_out = []
        for index, tool in enumerate(tools or []):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind in HOSTED_TOOLS:
                left_out.append(kind)
                continue
            if kind == "function":
                members = [_function(tool, None)]
            elif kind == "custom":
                members = [_custom(tool, None)]
            elif kind == "namespace":
                members = _namespace(tool)
            else:
                raise BadRequest(f"tool type {kind!r} is not supported: plugd serves function, custom and namespace "
                                 f"tools; hosted tools ({', '.join(sorted(HOSTED_TOOLS))}) are left out")
            for member in members:
                if member.tool.name in self.offered:
                    raise BadRequest(f"tools[{index}]: a tool named {member.tool.name!r} is offered twice")
                self.offered[member.tool.name] = member
        if left_out:
            log.info("left out hosted tools plugd cannot run: %s", ", ".join(left_out))

    @property
    def tools(self) -> list[Tool]:
        return [offered.tool for offered in self.offered.values()]

    def call_item(self, call: ToolCall) -> dict[str, Any]:
        """The output item of a call (without id and status): function_call, or custom_tool_call for a custom tool."""
        offered = self.offered.get(call.name)
        namespace = {"namespace": offered.namespace} if offered and offered.namespace else {}
        if offered and offered.kind == "custom":
            text = call.arguments.get(CUSTOM_INPUT)
            text = text if isinstance(text, str) else json_text(call.arguments)
            return {"type": "custom_tool_call", "call_id": call.id, "name": call.name, "input": text} | namespace
        return {"type": "function_call", "call_id": call.id, "name": call.name,
                "arguments": json_text(call.arguments)} | namespace


def json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def tool_choice(value: Any) -> ToolChoice:
    """none, auto, required, or the function or custom tool named; forcing a hosted tool is a 400."""
    if value is None or value in ("none", "auto", "required"):
        return ToolChoice(value or "auto")
    kind = value.get("type") if isinstance(value, dict) else value
    if kind in ("function", "custom"):
        return ToolChoice("named", _string(value, "name", "tool_choice"))
    if kind in HOSTED_TOOLS:
        raise BadRequest(f"tool_choice forces the hosted tool {kind!r}, which plugd cannot run")
    raise BadRequest(f"tool_choice {kind!r} is not supported: use none, auto, required, a function or a custom tool")
