"""Qwen3-Coder's chat template: tools described in XML, XML tool calls, no thinking."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from plugd.hookspecs import RenderRequest
from plugd.types import Message, Prompt, Tool
from plugd_render_qwen.conversation import prepared, turn
from plugd_render_qwen.xml_calls import CALL_INSTRUCTIONS, TOOLS_HEADING, render_call, template_text

_DEFAULT_SYSTEM = "You are Qwen, a helpful AI assistant that can interact with a computer to solve tasks."


def _extra_keys(fields: Mapping[str, Any], handled: Iterable[str]) -> str:
    """Schema keywords the template has no dedicated line for, each as <key>value</key>."""
    return "".join(f"\n<{key}>{template_text(value)}</{key}>" for key, value in fields.items() if key not in handled)


def _describe_parameter(name: str, fields: Any) -> str:
    fields = fields if isinstance(fields, Mapping) else {}
    text = f"\n<parameter>\n<name>{name}</name>"
    if "type" in fields:
        text += f"\n<type>{fields['type']}</type>"
    if "description" in fields:
        text += f"\n<description>{str(fields['description']).strip()}</description>"
    return text + _extra_keys(fields, ("name", "type", "description")) + "\n</parameter>"


def _describe(tool: Tool) -> str:
    text = f"\n<function>\n<name>{tool.name}</name>\n<description>{tool.description.strip()}</description>\n<parameters>"
    schema = tool.parameters if isinstance(tool.parameters, Mapping) else {}
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        text += "".join(_describe_parameter(name, fields) for name, fields in properties.items())
    return text + _extra_keys(schema, ("type", "properties")) + "\n</parameters>\n</function>"


def _system(system: str | None, tools: list[Tool]) -> str:
    if system is None and not tools:
        return ""
    text = "<|im_start|>system\n" + (system if system is not None else _DEFAULT_SYSTEM)
    if tools:
        text += "\n\n" + TOOLS_HEADING + "".join(_describe(tool) for tool in tools) + "\n</tools>" + CALL_INSTRUCTIONS
    return text + "<|im_end|>\n"


def _assistant_calls(message: Message) -> str:
    content = message.content.strip()
    text = f"\n{content}\n" if content else ""
    text += "".join("\n" + render_call(call) for call in message.tool_calls)
    return f"<|im_start|>assistant{text}<|im_end|>\n"


def _tool_response(messages: list[Message], index: int) -> str:
    # As upstream: a tool result that opens the conversation gets no turn header of its own.
    opens = index > 0 and messages[index - 1].role != "tool"
    closes = index == len(messages) - 1 or messages[index + 1].role != "tool"
    return ("<|im_start|>user\n" if opens else "") + f"<tool_response>\n{messages[index].content}\n</tool_response>\n" + \
        ("<|im_end|>\n" if closes else "")


def render(request: RenderRequest) -> Prompt:
    messages = prepared(request.messages, "Qwen3-Coder", images=False)
    system = None
    if messages and messages[0].role == "system":
        system, messages = messages[0].content, messages[1:]
    parts = [_system(system, list(request.tools))]
    for index, message in enumerate(messages):
        if message.role == "assistant" and message.tool_calls:
            parts.append(_assistant_calls(message))
        elif message.role == "tool":
            parts.append(_tool_response(messages, index))
        else:
            parts.append(turn(message.role, message.content))
    parts.append("<|im_start|>assistant\n")
    return Prompt(text="".join(parts))
