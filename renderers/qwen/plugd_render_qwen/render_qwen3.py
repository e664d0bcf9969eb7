"""Qwen3's chat template (Hermes JSON tool calls), and Qwen3 Instruct-2507's, which is the same without thinking."""

from __future__ import annotations

from plugd.hookspecs import RenderRequest
from plugd.types import Message, Prompt, Tool
from plugd_render_qwen import hermes
from plugd_render_qwen.conversation import json_signatures, last_query_index, prepared, split_reasoning, tool_response, turn

_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
)
_EMPTY_THINKING = "<think>\n\n</think>\n\n"


def _system(messages: list[Message], tools: list[Tool]) -> str:
    system = messages[0].content if messages and messages[0].role == "system" else None
    if not tools:
        return turn("system", system) if system is not None else ""
    preamble = system + "\n\n" if system is not None else ""
    return f"<|im_start|>system\n{preamble}{_TOOLS_INTRO}{json_signatures(tools)}{_TOOLS_OUTRO}"


def _assistant(message: Message, keeps_reasoning: bool, is_last: bool, thinking: bool) -> str:
    content = message.content
    reasoning = ""
    if thinking:
        reasoning, content = split_reasoning(message, content)
    if keeps_reasoning and (is_last or reasoning):
        text = "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n")
    else:
        text = content
    for index, call in enumerate(message.tool_calls):
        if index or content:
            text += "\n"
        text += hermes.render_call(call)
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def render(request: RenderRequest, *, thinking: bool = True) -> Prompt:
    """Qwen3's template; with `thinking` off, Instruct-2507's (no reasoning in history, no empty think block)."""
    messages = prepared(request.messages, "Qwen3", images=False)
    tools = list(request.tools)
    parts = [_system(messages, tools)]
    last_query = last_query_index(messages, lambda message: message.content)
    for index, message in enumerate(messages):
        if message.role == "user" or (message.role == "system" and index > 0):
            parts.append(turn(message.role, message.content))
        elif message.role == "assistant":
            is_last = index == len(messages) - 1
            parts.append(_assistant(message, thinking and index > last_query, is_last, thinking))
        elif message.role == "tool":
            parts.append(tool_response(messages, index, message.content))
    parts.append("<|im_start|>assistant\n")
    if thinking and request.think is False:
        parts.append(_EMPTY_THINKING)
    return Prompt(text="".join(parts))
