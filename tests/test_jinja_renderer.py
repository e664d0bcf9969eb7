"""The built-in renderer agrees with transformers' own chat-template rendering on the upstream templates."""

import re
from pathlib import Path

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from plugd.builtins.jinja_renderer import ChatTemplateError, message_dict, render
from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.rendering import tool_dict
from plugd.types import Media, Message, Tool, ToolCall

TEMPLATES = Path(__file__).resolve().parent / "reference" / "chat_templates"
WEATHER = Tool(
    name="get_weather",
    description="Current weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
CONVERSATIONS = {
    "plain": [Message("user", "Hello!")],
    "system": [Message("system", "Be terse."), Message("user", "Hi"), Message("assistant", "Hey."),
               Message("user", "Again")],
    "tools": [
        Message("system", "You can call tools."),
        Message("user", "Weather in Paris?"),
        Message("assistant", "", tool_calls=[ToolCall("get_weather", {"city": "Paris"})]),
        Message("tool", '{"temp": 21}', tool_name="get_weather"),
        Message("user", "Thanks; and Köln?"),
    ],
    "thinking-history": [Message("user", "2+2?"), Message("assistant", "4", thinking="Add them."),
                         Message("user", "3+3?")],
    "image": [Message("user", "What is in it?", images=[Media(b"\x89PNG", "image/png")])],
}


@pytest.mark.parametrize("template", ["qwen3.jinja", "qwen3-coder.jinja", "qwen3.5.jinja", "gemma3.jinja",
                                      "nemotron-3-nano.jinja"])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("think", [None, False, True])
def test_matches_transformers(template, conversation, think):
    source = (TEMPLATES / template).read_text()
    messages = CONVERSATIONS[conversation]
    tools = [WEATHER] if conversation == "tools" else []
    model = ModelFiles(config={}, chat_template=source, tokenizer_config={"bos_token": "<bos>", "eos_token": "<eos>"})
    extra = {} if think is None else {"enable_thinking": think}
    try:
        theirs = render_jinja_template(
            conversations=[[message_dict(m) for m in messages]], tools=[tool_dict(t) for t in tools] or None,
            chat_template=source, add_generation_prompt=True, bos_token="<bos>", eos_token="<eos>", **extra,
        )[0][0]
    except Exception as exc:  # the template refuses this conversation (gemma3 has no tool role): so must we
        with pytest.raises(ChatTemplateError, match=re.escape(str(exc)[:40])):
            render(RenderRequest(model=model, messages=messages, tools=tools, think=think))
        return
    assert render(RenderRequest(model=model, messages=messages, tools=tools, think=think)).text == theirs


def test_template_errors_are_reported():
    model = ModelFiles(config={}, chat_template="{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        render(RenderRequest(model=model, messages=[Message("user", "x")]))
    with pytest.raises(ChatTemplateError, match="no chat template"):
        render(RenderRequest(model=ModelFiles(config={}), messages=[Message("user", "x")]))


def test_sandbox_blocks_attribute_escapes():
    model = ModelFiles(config={}, chat_template="{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        render(RenderRequest(model=model, messages=[Message("user", "x")]))


def test_images_come_before_the_text_as_content_parts():
    model = ModelFiles(config={}, chat_template=(TEMPLATES / "qwen3.5.jinja").read_text())
    prompt = render(RenderRequest(model=model, messages=CONVERSATIONS["image"]))
    assert "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is in it?<|im_end|>" in prompt.text
    assert [m.mime_type for m in prompt.media] == ["image/png"]
