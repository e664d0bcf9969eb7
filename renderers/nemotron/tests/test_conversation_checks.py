"""What both renderers refuse, with messages a client can act on; and which templates each one recognises."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.testing.tokenizer import CHAT_TEMPLATE
from plugd.types import Media, Message, ToolCall
from plugd_render_nemotron import nano3, nano_v2

TEMPLATES = Path(__file__).resolve().parents[3] / "tests/reference/chat_templates"
RENDERERS = {"nemotron-nano-v2": nano_v2, "nemotron-3-nano": nano3}


@pytest.fixture(params=sorted(RENDERERS))
def family(request):
    return RENDERERS[request.param]


def render(family, messages: list[Message]) -> str:
    return family.render(RenderRequest(ModelFiles(config={}), messages)).text


CALL = ToolCall("get_weather", {"city": "Paris"}, id="call_1")


def test_unknown_role_is_refused(family):
    with pytest.raises(ValueError, match=r"invalid message role 'narrator'"):
        render(family, [Message("user", "Hi"), Message("narrator", "Once upon a time")])


def test_images_are_refused(family):
    with pytest.raises(ValueError, match=f"^{family.NAME} does not take images$"):
        render(family, [Message("user", "What is this?", images=[Media(b"\x89PNG", "image/png")])])


@pytest.mark.parametrize(("result", "named"), [
    (Message("tool", "x", tool_call_id="call_9"), "tool result 'call_9'"),
    (Message("tool", "x", tool_name="get_time"), "tool result 'get_time'"),
])
def test_tool_result_must_answer_an_earlier_call(family, result, named):
    with pytest.raises(ValueError, match=f"^{named} answers no earlier tool call$"):
        render(family, [Message("user", "Weather?"), Message("assistant", "", tool_calls=[CALL]), result])


def test_tool_result_without_any_call_is_refused(family):
    with pytest.raises(ValueError, match="^a tool result without a name or id answers no earlier tool call$"):
        render(family, [Message("user", "Weather?"), Message("tool", "sunny")])


def test_tool_result_cannot_answer_a_later_call(family):
    with pytest.raises(ValueError, match="'call_1'"):
        render(family, [Message("user", "Weather?"), Message("tool", "sunny", tool_call_id="call_1"),
                        Message("assistant", "", tool_calls=[CALL])])


def test_matching_tool_results_render(family):
    messages = [Message("user", "Weather?"), Message("assistant", "", tool_calls=[CALL]),
                Message("tool", "sunny", tool_call_id="call_1"), Message("tool", "warm", tool_name="get_weather")]
    assert "sunny" in render(family, messages) and "warm" in render(family, messages)


@pytest.mark.parametrize("path", sorted(TEMPLATES.glob("*.jinja")), ids=lambda p: p.stem)
def test_detects_only_its_own_template(path):
    model = ModelFiles(config={}, chat_template=path.read_text())
    assert {name for name, family in RENDERERS.items() if family.detect(model)} == (
        {path.stem} if path.stem in RENDERERS else set())


def test_does_not_claim_generic_chatml_or_no_template():
    for model in (ModelFiles(config={}, chat_template=CHAT_TEMPLATE), ModelFiles(config={})):
        assert not nano_v2.detect(model) and not nano3.detect(model)
