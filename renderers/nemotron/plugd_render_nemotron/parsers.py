"""The two families' output parsers: what is inside a call block, and a StreamParser for each family."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from plugd.parsing import ParseError, parse_json_arguments, typed_argument
from plugd.types import Tool, ToolCall

from .stream import ThinkingAndCallsParser


def nano_v2_parser(tools: Sequence[Tool], prompt: str) -> ThinkingAndCallsParser:
    """`<TOOLCALL>[{"name": ..., "arguments": {...}}, ...]</TOOLCALL>`."""
    return ThinkingAndCallsParser(prompt, "<TOOLCALL>", "</TOOLCALL>", decode_json_calls if tools else None)


def nano3_parser(tools: Sequence[Tool], prompt: str) -> ThinkingAndCallsParser:
    """`<tool_call><function=NAME><parameter=KEY>value</parameter>...</function></tool_call>`, values typed by schema."""
    schemas = {tool.name: tool.parameters.get("properties", {}) for tool in tools}
    return ThinkingAndCallsParser(prompt, "<tool_call>", "</tool_call>",
                                  (lambda body: [decode_xml_call(body, schemas)]) if tools else None)


def decode_json_calls(body: str) -> list[ToolCall]:
    """The calls of one `<TOOLCALL>` block: a JSON list of {"name", "arguments"} (a lone object is taken too)."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ParseError(f"a <TOOLCALL> block is not valid JSON: {exc}") from None
    return [_json_call(item) for item in (value if isinstance(value, list) else [value])]


def _json_call(item: Any) -> ToolCall:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        raise ParseError(f"a tool call must be an object with a \"name\", not {json.dumps(item)[:200]}")
    arguments = item.get("arguments")
    if isinstance(arguments, str):
        arguments = parse_json_arguments(arguments, item["name"])
    elif arguments is None:
        arguments = {}
    elif not isinstance(arguments, dict):
        raise ParseError(f"the arguments of the call to {item['name']!r} are not a JSON object")
    return ToolCall(item["name"], arguments)


_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def decode_xml_call(body: str, schemas: Mapping[str, Mapping[str, Any]]) -> ToolCall:
    """The call in one `<tool_call>` block; `schemas` maps tool names to their parameters' property schemas.

    A value loses the one newline the format puts on each side of it and is
    converted to its declared type.
    """
    function = _FUNCTION.fullmatch(body)
    if function is None:
        raise ParseError(f"a <tool_call> block holds no <function=...>...</function>: {body[:200]!r}")
    name, inside = function.group(1).strip(), function.group(2)
    properties = schemas.get(name, {})
    arguments: dict[str, Any] = {}
    end = 0
    for parameter in _PARAMETER.finditer(inside):
        if inside[end:parameter.start()].strip():
            raise ParseError(f"unexpected text in the call to {name!r}: {inside[end:parameter.start()][:200]!r}")
        key, value = parameter.group(1).strip(), parameter.group(2)
        value = value.removeprefix("\n").removesuffix("\n")
        arguments[key] = typed_argument(value, properties.get(key))
        end = parameter.end()
    if inside[end:].strip():
        raise ParseError(f"unexpected text in the call to {name!r}: {inside[end:][:200]!r}")
    return ToolCall(name, arguments)
