"""The Qwen3.5 chat template and its variants (thinking off unless asked; Qwen3.6's JSON-typed call arguments).

Unlike upstream, which refuses a system message after the first turn, a
later system (or developer) message is written in place as a system turn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plugd.hookspecs import RenderRequest
from plugd.types import Message, Prompt, Tool
from plugd_render_qwen.conversation import json_signatures, last_query_index, prepared, split_reasoning, tool_response, turn
from plugd_render_qwen.xml_calls import CALL_INSTRUCTIONS, TOOLS_HEADING, render_call

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


def _content(message: Message) -> str:
    """The message as the template writes it: one placeholder per image, before its text, all trimmed."""
    return (IMAGE_PLACEHOLDER * len(message.images) + message.content).strip()


def _system(messages: list[Message], tools: list[Tool]) -> str:
    system = _content(messages[0]) if messages and messages[0].role == "system" else None
    if not tools:
        return turn("system", system) if system is not None else ""
    preamble = "\n\n" + system if system else ""
    return f"<|im_start|>system\n{TOOLS_HEADING}{json_signatures(tools)}\n</tools>{CALL_INSTRUCTIONS}{preamble}<|im_end|>\n"


def _assistant(message: Message, keeps_reasoning: bool, value_text: Callable[[Any], str]) -> str:
    reasoning, content = split_reasoning(message, _content(message))
    text = f"<think>\n{reasoning.strip()}\n</think>\n\n{content}" if keeps_reasoning else content
    for index, call in enumerate(message.tool_calls):
        separator = "\n" if index else "\n\n" if content.strip() else ""
        text += separator + render_call(call, value_text)
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def render(request: RenderRequest, *, thinks_by_default: bool, value_text: Callable[[Any], str]) -> Prompt:
    messages = prepared(request.messages, "Qwen3.5", images=True)
    if any(message.role == "system" and message.images for message in messages):
        raise ValueError("a system message cannot contain images")
    parts = [_system(messages, list(request.tools))]
    last_query = last_query_index(messages, _content)
    for index, message in enumerate(messages):
        if message.role == "user" or (message.role == "system" and index > 0):
            parts.append(turn(message.role, _content(message)))
        elif message.role == "assistant":
            parts.append(_assistant(message, index > last_query, value_text))
        elif message.role == "tool":
            parts.append(tool_response(messages, index, _content(message)))
    thinking = thinks_by_default if request.think is None else bool(request.think)
    parts.append("<|im_start|>assistant\n" + ("<think>\n" if thinking else "<think>\n\n</think>\n\n"))
    media = [image for message in messages for image in message.images]
    return Prompt(text="".join(parts), media=media)
