"""Hermes-style tool calls, as Qwen3 writes them: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from plugd.hookspecs import ForcedCall
from plugd.parsing import ParseError, parse_json_arguments
from plugd.types import Tool, ToolCall


def render_call(call: ToolCall) -> str:
    arguments = json.dumps(call.arguments, ensure_ascii=False)
    return f'<tool_call>\n{{"name": "{call.name}", "arguments": {arguments}}}\n</tool_call>'


def read_call(body: str, tools: Mapping[str, Tool]) -> ToolCall:
    """The call written between <tool_call> and </tool_call>: a JSON object with a name and arguments."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ParseError(f"a tool call is not valid JSON ({exc}): {body.strip()[:200]!r}") from None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        raise ParseError(f"a tool call is not a JSON object with a name: {body.strip()[:200]!r}")
    name = value["name"]
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some fine-tunes write the arguments as a JSON string
        arguments = parse_json_arguments(arguments, name)
    if not isinstance(arguments, dict):
        raise ParseError(f"the arguments of the call to {name!r} are not a JSON object")
    return ToolCall(name=name, arguments=arguments)


def forced_call(tools: Sequence[Tool]) -> ForcedCall:
    """A call to one of `tools`: the tags around a JSON object naming the tool, its arguments per its schema."""
    calls = [{"type": "object", "properties": {"name": {"const": tool.name},
                                               "arguments": tool.parameters or {"type": "object"}},
              "required": ["name", "arguments"], "additionalProperties": False} for tool in tools]
    return ForcedCall(prefix="<tool_call>\n", schema=calls[0] if len(calls) == 1 else {"anyOf": calls},
                      suffix="\n</tool_call>")
