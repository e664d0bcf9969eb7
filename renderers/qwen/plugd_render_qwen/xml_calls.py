"""XML tool calls, as Qwen3-Coder and Qwen3.5 write them.

    <tool_call>
    <function=NAME>
    <parameter=P>
    value, as bare text that may span lines
    </parameter>
    </function>
    </tool_call>
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from plugd.parsing import ParseError, typed_argument
from plugd.types import Tool, ToolCall

TOOLS_HEADING = "# Tools\n\nYou have access to the following functions:\n\n<tools>"
CALL_INSTRUCTIONS = (
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within "
    "<tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, "
    "but NOT after\n- If there is no function call available, answer the question like normal with your current "
    "knowledge and do not tell the user about function calls\n</IMPORTANT>"
)
"""What the Qwen3-Coder and Qwen3.5 templates say about calling tools, after the tool list."""

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def template_text(value: Any) -> str:
    """A value as the templates print it: objects and arrays as JSON, anything else as Python's str() (True, None)."""
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def json_text(value: Any) -> str:
    """A value as Qwen3.6's template prints it: strings bare, everything else as JSON (true, null)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render_call(call: ToolCall, value_text: Callable[[Any], str] = template_text) -> str:
    parameters = "".join(f"<parameter={name}>\n{value_text(value)}\n</parameter>\n" for name, value in call.arguments.items())
    return f"<tool_call>\n<function={call.name}>\n{parameters}</function>\n</tool_call>"


def read_call(body: str, tools: Mapping[str, Tool]) -> ToolCall:
    """The call written between <tool_call> and </tool_call>, its parameters typed by the tool's JSON schema."""
    function = _FUNCTION.fullmatch(body)
    if function is None:
        raise ParseError(f"a tool call is not a <function=...>...</function> block: {body.strip()[:200]!r}")
    name = function.group(1).strip()
    tool = tools.get(name)
    properties = tool.parameters.get("properties", {}) if tool else {}
    arguments: dict[str, Any] = {}
    position = 0
    inner = function.group(2)
    for parameter in _PARAMETER.finditer(inner):
        _expect_blank(inner[position : parameter.start()], name)
        position = parameter.end()
        key = parameter.group(1).strip()
        value = parameter.group(2).removeprefix("\n").removesuffix("\n")
        arguments[key] = typed_argument(value, properties.get(key))
    _expect_blank(inner[position:], name)
    return ToolCall(name=name, arguments=arguments)


def _expect_blank(text: str, name: str) -> None:
    if text.strip():
        raise ParseError(f"unexpected text in the call to {name!r}: {text.strip()[:200]!r}")
