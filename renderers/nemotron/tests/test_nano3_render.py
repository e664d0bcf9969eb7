"""The Nemotron 3 Nano renderer against the upstream template, and where it chooses differently."""

from __future__ import annotations

from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.types import Message, Think, ToolCall
from plugd_render_nemotron import nano3

TEMPLATE = "nemotron-3-nano"


def render(messages: list[Message], tools=(), think: Think = None) -> str:
    return nano3.render(RenderRequest(ModelFiles(config={}), messages, tools, think)).text


def test_matches_upstream(scenario, think, upstream):
    messages, tools = scenario
    assert render(messages, tools, think) == upstream(TEMPLATE, messages, tools, think)


def test_generation_prompt_follows_think():
    messages = [Message("user", "Hi")]
    assert render(messages).endswith("<|im_start|>assistant\n<think>\n")
    assert render(messages, think="low").endswith("<|im_start|>assistant\n<think>\n")
    assert render(messages, think=False).endswith("<|im_start|>assistant\n<think></think>")


def test_later_system_message_renders_in_place_as_upstream(upstream):
    messages = [
        Message("system", "First."),
        Message("user", "Hi"),
        Message("assistant", "", tool_calls=[ToolCall("ping", {})]),
        Message("system", "Tools are slow today."),
        Message("tool", "pong"),
        Message("system", "Answer in French."),
    ]
    text = render(messages)
    assert text == upstream(TEMPLATE, messages)
    assert text.endswith(
        "<|im_start|>system\nTools are slow today.<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\npong\n</tool_response>\n<|im_end|>\n"
        "<|im_start|>system\nAnswer in French.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )


def test_developer_renders_as_system(upstream):
    messages = [Message("developer", "Rules."), Message("user", "Hi"),
                Message("assistant", "Hello"), Message("developer", "Later rule"), Message("user", "Go")]
    as_system = [Message("system", m.content) if m.role == "developer" else m for m in messages]
    text = render(messages)
    assert text == upstream(TEMPLATE, as_system)
    assert text.startswith("<|im_start|>system\nRules.<|im_end|>\n")
    assert "<|im_start|>system\nLater rule<|im_end|>\n" in text
    # upstream itself would print "developer" turns the model was never trained on
    assert "<|im_start|>developer\n" in upstream(TEMPLATE, messages)


def test_argument_values_print_as_upstream():
    call = ToolCall("f", {"s": "two\nlines", "n": 3, "x": 0.5, "b": False, "z": None, "l": [1, "a"], "o": {"k": "é"}})
    text = render([Message("user", "u"), Message("assistant", "", tool_calls=[call]), Message("tool", "ok")])
    assert (
        "<tool_call>\n<function=f>\n<parameter=s>\ntwo\nlines\n</parameter>\n<parameter=n>\n3\n</parameter>\n"
        "<parameter=x>\n0.5\n</parameter>\n<parameter=b>\nFalse\n</parameter>\n<parameter=z>\nNone\n</parameter>\n"
        '<parameter=l>\n[1, "a"]\n</parameter>\n<parameter=o>\n{"k": "é"}\n</parameter>\n</function>\n</tool_call>\n'
    ) in text
