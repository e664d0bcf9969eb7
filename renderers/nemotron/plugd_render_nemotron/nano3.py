"""Nemotron 3 Nano: ChatML turns, `<think>` reasoning, Qwen3-Coder-style XML tool calls.

Reproduces the upstream chat template byte for byte (with its defaults:
history reasoning before the last user turn is dropped). Where it differs:

- `developer` is rendered as `system` (upstream would print a `developer` turn),
  so a leading developer message is the system prompt;
- a system message after the first one is rendered in place as
  `<|im_start|>system\\n{content}<|im_end|>\\n`, exactly as upstream does;
- unknown roles are refused (upstream prints them as turns of that role).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.types import Message, Prompt, Tool, ToolCall

from .conversation import prepared
from .templating import tojson

NAME = "nemotron-3-nano"

THINK_OFF = "<think></think>"

TOOLS_HEADER = "# Tools\n\nYou have access to the following functions:\n\n<tools>"
TOOLS_FOOTER = (
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested "
    "within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, "
    "but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge and do "
    "not tell the user about function calls\n</IMPORTANT>"
)


def detect(model: ModelFiles) -> bool:
    template = model.chat_template or ""
    return "truncate_history_thinking" in template and "<function=" in template


def render(request: RenderRequest) -> Prompt:
    messages = prepared(request.messages, NAME)
    system = messages[0].content if messages and messages[0].role == "system" else ""
    turns = messages[1:] if messages and messages[0].role == "system" else messages
    last_user = max((i for i, m in enumerate(turns) if m.role == "user"), default=-1)
    out = ["<|im_start|>system\n", system]
    if request.tools:
        out += ["\n\n" if system else "", TOOLS_HEADER, *map(_tool_xml, request.tools), TOOLS_FOOTER]
    out.append("<|im_end|>\n")
    for i, message in enumerate(turns):
        if message.role == "assistant":
            out.append(_assistant(message, in_history=i < last_user))
        elif message.role == "tool":
            # a valid tool result always follows its assistant call, so turns[i - 1] exists
            if turns[i - 1].role != "tool":
                out.append("<|im_start|>user\n")
            out.append(f"<tool_response>\n{message.content}\n</tool_response>\n")
            if i + 1 == len(turns) or turns[i + 1].role != "tool":
                out.append("<|im_end|>\n")
        else:
            out.append(f"<|im_start|>{message.role}\n{message.content}<|im_end|>\n")
    thinking = True if request.think is None else bool(request.think)
    out.append("<|im_start|>assistant\n" + ("<think>\n" if thinking else THINK_OFF))
    return Prompt("".join(out))


def _assistant(message: Message, in_history: bool) -> str:
    """An assistant turn; `in_history` (before the last user turn) drops its reasoning, as upstream does by default."""
    if message.thinking and message.thinking.strip():
        content = f"<think>\n{message.thinking}\n</think>\n{message.content}"
    elif "<think>" not in message.content and "</think>" not in message.content:
        content = THINK_OFF + message.content
    else:
        content = message.content
    if not message.tool_calls:
        if in_history and "<think>" in content and "</think>" in content:
            content = THINK_OFF + content.split("</think>")[-1]
        return f"<|im_start|>assistant\n{content.strip()}<|im_end|>\n"
    # content is never blank here: it holds at least one think tag
    if in_history:
        if "</think>" in content:
            content = content.split("</think>")[-1]
        elif "<think>" in content:
            content = content.split("<think>")[0]
        content = THINK_OFF + content.strip()
    calls = "".join(map(_tool_call_xml, message.tool_calls))
    return f"<|im_start|>assistant\n{content.strip()}\n{calls}<|im_end|>\n"


def _tool_call_xml(call: ToolCall) -> str:
    parameters = "".join(f"<parameter={name}>\n{_argument_text(value)}\n</parameter>\n"
                         for name, value in call.arguments.items())
    return f"<tool_call>\n<function={call.name}>\n{parameters}</function>\n</tool_call>\n"


def _argument_text(value: Any) -> str:
    return tojson(value) if isinstance(value, (Mapping, list)) else str(value)


def _tool_xml(tool: Tool) -> str:
    out = [f"\n<function>\n<name>{tool.name}</name>\n<description>{tool.description.strip()}</description>\n<parameters>"]
    schema = tool.parameters
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        for name, fields in properties.items():
            fields = fields if isinstance(fields, Mapping) else {}
            out.append(f"\n<parameter>\n<name>{name}</name>")
            if "type" in fields:
                out.append(f"\n<type>{fields['type']}</type>")
            if "description" in fields:
                out.append(f"\n<description>{str(fields['description']).strip()}</description>")
            if "enum" in fields:
                out.append(f"\n<enum>{tojson(fields['enum'])}</enum>")
            out.append(_extra_keys(fields, ("name", "type", "description", "enum")))
            out.append("\n</parameter>")
    out.append(_extra_keys(schema, ("type", "properties", "required")))
    if "required" in schema:
        out.append(f"\n<required>{tojson(schema['required'])}</required>")
    out.append("\n</parameters>\n</function>")
    return "".join(out)


def _extra_keys(fields: Mapping[str, Any], handled: tuple[str, ...]) -> str:
    """Schema keys the template has no slot for, each as `<key>value</key>` (the template's render_extra_keys)."""
    return "".join(f"\n<{key}>{_argument_text(value)}</{key}>" for key, value in fields.items() if key not in handled)
