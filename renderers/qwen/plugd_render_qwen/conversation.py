"""What every Qwen renderer does to a conversation before writing it: role checks, tool-result checks, reasoning."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import attrs

from plugd.rendering import check_conversation, tool_dict
from plugd.types import Message, Tool

TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"


def prepared(messages: Sequence[Message], family: str, *, images: bool) -> list[Message]:
    """The messages with developer turns made system turns, as Qwen has no developer role.

    Refuses what no Qwen template can write: unknown roles, tool results that
    answer no call, and images for a model without vision.
    """
    check_conversation(messages, [])
    if not images and any(message.images for message in messages):
        raise ValueError(f"{family} models take no images")
    return [attrs.evolve(m, role="system") if m.role == "developer" else m for m in messages]


def json_signatures(tools: Sequence[Tool]) -> str:
    """The tools as Qwen3 and Qwen3.5 list them: one JSON object per line, in the Hugging Face function shape."""
    return "".join("\n" + json.dumps(tool_dict(tool), ensure_ascii=False) for tool in tools)


def turn(role: str, text: str) -> str:
    return f"<|im_start|>{role}\n{text}<|im_end|>\n"


def tool_response(messages: Sequence[Message], index: int, content: str) -> str:
    """A tool result as Qwen3 and Qwen3.5 write it: a run of results shares one user turn."""
    opens = index == 0 or messages[index - 1].role != "tool"
    closes = index == len(messages) - 1 or messages[index + 1].role != "tool"
    text = f"\n{TOOL_RESPONSE_OPEN}\n{content}\n{TOOL_RESPONSE_CLOSE}"
    return ("<|im_start|>user" if opens else "") + text + ("<|im_end|>\n" if closes else "")


def split_reasoning(message: Message, content: str) -> tuple[str, str]:
    """(reasoning, answer): the message's thinking, or else a <think>...</think> block written into its content."""
    if message.thinking:
        return message.thinking, content
    if "</think>" not in content:
        return "", content
    parts = content.split("</think>")
    return parts[0].rstrip("\n").split("<think>")[-1].lstrip("\n"), parts[-1].lstrip("\n")


def last_query_index(messages: Sequence[Message], content: Callable[[Message], str]) -> int:
    """The index of the last user turn that is a real query, not tool results passed as a user turn.

    Reasoning is kept in the prompt only for assistant turns after it; with no
    such turn, the last index (so no reasoning is kept).
    """
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role != "user":
            continue
        text = content(messages[index])
        if not (text.startswith(TOOL_RESPONSE_OPEN) and text.endswith(TOOL_RESPONSE_CLOSE)):
            return index
    return len(messages) - 1
