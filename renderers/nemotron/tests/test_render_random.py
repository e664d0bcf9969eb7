"""Both renderers against their upstream templates over many random conversations built from awkward pieces."""

from __future__ import annotations

import random

import pytest

from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.types import Message, Tool, ToolCall
from plugd_render_nemotron import nano3, nano_v2

TEXTS = ["", "  hi  ", "plain", "a /think b", "x /no_think", "<think>r</think>ans", "<think>open", "t</think>",
         "a</think>b</think>c", "multi\nline\n", "é ü 中文", '{"json": [1, 2]}', "\n\n", "/thinking aloud"]
THOUGHTS = [None, "", "  ", "reasoning", "\nline\n"]
ARGUMENTS = [{}, {"q": "x"}, {"n": 1, "f": 0.25, "b": True, "z": None}, {"l": [1, "2"], "o": {"k": "v", "u": "ü"}}]
TOOLS = [Tool("lookup", " find things ", {"type": "object", "properties": {"q": {"type": "string", "description": "query"}},
                                          "required": ["q"]}),
         Tool("calc", "", {"type": "object", "properties": {"n": {"type": "integer", "enum": [1, 2]}, "l": {"type": "array"}},
                           "additionalProperties": False})]


def conversation(rng: random.Random, mid_system: bool) -> list[Message]:
    messages = [Message("system", rng.choice(TEXTS))] if rng.random() < 0.6 else []
    messages.append(Message("user", rng.choice(TEXTS)))
    for _ in range(rng.randint(0, 6)):
        kind = rng.choice(["user", "assistant", "calls", "system"] if mid_system else ["user", "assistant", "calls"])
        if kind == "calls":
            calls = [ToolCall(rng.choice(["lookup", "calc"]), rng.choice(ARGUMENTS)) for _ in range(rng.randint(1, 3))]
            messages.append(Message("assistant", rng.choice(TEXTS), thinking=rng.choice(THOUGHTS), tool_calls=calls))
            messages += [Message("tool", rng.choice(TEXTS)) for _ in range(rng.randint(0, 3))]
        elif kind == "assistant":
            messages.append(Message("assistant", rng.choice(TEXTS), thinking=rng.choice(THOUGHTS)))
        else:
            messages.append(Message(kind, rng.choice(TEXTS)))
    return messages


def ours(family, messages, tools, think) -> str:
    return family.render(RenderRequest(ModelFiles(config={}), messages, tools, think)).text


@pytest.mark.parametrize("seed", range(4))
def test_nano3_matches_upstream_on_random_conversations(seed, upstream):
    rng = random.Random(seed)
    for _ in range(100):
        messages, tools, think = conversation(rng, mid_system=True), rng.choice([[], TOOLS]), rng.choice([None, True, False])
        assert ours(nano3, messages, tools, think) == upstream("nemotron-3-nano", messages, tools, think), messages


@pytest.mark.parametrize("seed", range(4))
def test_nano_v2_matches_upstream_on_random_conversations(seed, upstream):
    rng = random.Random(seed)
    for _ in range(100):
        messages, tools, think = conversation(rng, mid_system=False), rng.choice([[], TOOLS]), rng.choice([None, True, False])
        assert ours(nano_v2, messages, tools, think) == upstream("nemotron-nano-v2", messages, tools, think)
