"""The Nemotron Nano v2 renderer against the upstream template, and where it chooses differently."""

from __future__ import annotations

import attrs

from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.types import Message, Think, ToolCall
from plugd_render_nemotron import nano_v2

TEMPLATE = "nemotron-nano-v2"


def render(messages: list[Message], tools=(), think: Think = None) -> str:
    return nano_v2.render(RenderRequest(ModelFiles(config={}), messages, tools, think)).text


def test_matches_upstream(scenario, think, upstream):
    messages, tools = scenario
    assert render(messages, tools, think) == upstream(TEMPLATE, messages, tools, think)


def test_generation_prompt_follows_think():
    messages = [Message("system", "S /no_think"), Message("user", "Hi /think")]
    assert render(messages).endswith("<SPECIAL_11>Assistant\n<think>\n")
    assert render(messages, think=False).endswith("<SPECIAL_11>Assistant\n<think></think>")
    assert render(messages[:1] + [Message("user", "Hi")]).endswith("<think></think>")


def test_developer_renders_as_system():
    messages = [Message("developer", "Rules. /no_think"), Message("user", "Hi"),
                Message("assistant", "Hello"), Message("developer", "Later rule"), Message("user", "Go")]
    as_system = [attrs.evolve(m, role="system") if m.role == "developer" else m for m in messages]
    assert render(messages) == render(as_system)
    assert render(messages).startswith("<SPECIAL_10>System\nRules.\n\n<SPECIAL_11>User\nHi\n")


def test_later_system_message_renders_in_place(upstream):
    messages = [
        Message("system", "First."),
        Message("user", "Hi"),
        Message("assistant", "Hello"),
        Message("system", "  Now answer in French. /no_think "),
        Message("user", "Bye"),
    ]
    assert render(messages) == (
        "<SPECIAL_10>System\nFirst.\n\n"
        "<SPECIAL_11>User\nHi\n"
        "<SPECIAL_11>Assistant\nHello\n<SPECIAL_12>\n"
        "<SPECIAL_10>System\nNow answer in French.\n\n"
        "<SPECIAL_11>User\nBye\n"
        "<SPECIAL_11>Assistant\n<think></think>"
    )
    # upstream drops the message (but still obeys its marker): the rest is identical
    in_place = "<SPECIAL_10>System\nNow answer in French.\n\n"
    assert render(messages).replace(in_place, "", 1) == upstream(TEMPLATE, messages)


def test_system_message_between_tool_results_and_answer(upstream):
    messages = [
        Message("user", "Weather?"),
        Message("assistant", "", tool_calls=[ToolCall("get_weather", {"city": "Paris"})]),
        Message("tool", "sunny"),
        Message("system", "Be brief."),
    ]
    text = render(messages)
    assert '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>\n<SPECIAL_12>\n' in text
    assert text.endswith("<TOOL_RESPONSE>[sunny]</TOOL_RESPONSE><SPECIAL_10>System\nBe brief.\n\n"
                         "<SPECIAL_11>Assistant\n<think>\n")
    assert text.replace("<SPECIAL_10>System\nBe brief.\n\n", "") == upstream(TEMPLATE, messages)


def test_final_assistant_message_is_continued():
    text = render([Message("user", "Start a list"), Message("assistant", "  1. apples\n")], think=True)
    assert text.endswith("<SPECIAL_11>User\nStart a list\n<SPECIAL_11>Assistant\n<think>\n1. apples")
