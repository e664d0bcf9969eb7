"""The Python renderers write exactly what the upstream Jinja chat templates render, over a matrix of conversations."""

from pathlib import Path

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from plugd.builtins import jinja_renderer
from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.rendering import tool_dict
from plugd.types import Media, Message, Tool, ToolCall
from plugd_render_qwen.renderers import RENDERERS

TEMPLATES = Path(__file__).resolve().parents[3] / "tests/reference/chat_templates"
RENDERER = {renderer.name: renderer for renderer in RENDERERS}
TEMPLATES_OF = {
    "qwen3": ["qwen3.jinja", "qwen3-legacy-2025-05.jinja"],
    "qwen3-instruct": ["qwen3-instruct-2507.jinja"],
    "qwen3-coder": ["qwen3-coder.jinja"],
    "qwen3.5": ["qwen3.5.jinja"],
    "qwen3.5-nothink": ["qwen3.5-nothink.jinja"],
    "qwen3.6": ["qwen3.6.jinja"],
}
PAIRS = [(name, template) for name, templates in TEMPLATES_OF.items() for template in templates]
VISION = {"qwen3.5", "qwen3.5-nothink", "qwen3.6"}
REFUSES_LATE_SYSTEM = VISION  # upstream raises "System message must be at the beginning"; we render it in place

WEATHER = Tool(
    name="get_weather",
    description="  Current weather for a city.\n",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name "},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": ["integer", "null"], "minimum": 1},
        },
        "required": ["city"],
    },
)
EDIT = Tool(
    name="edit_file",
    description="Edit a file",
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "patch": {"type": "object", "properties": {"old": {"type": "string"}}},
            "lines": {"type": "array", "items": {"type": "integer"}},
            "force": {"type": "boolean", "default": False},
        },
        "additionalProperties": False,
    },
)
BARE = Tool(name="now", parameters={"type": "object", "properties": {}})
TOOLS = [WEATHER, EDIT, BARE]

PARIS = ToolCall("get_weather", {"city": "Paris", "unit": "celsius"}, id="call_1")
KOELN = ToolCall("get_weather", {"city": "Köln", "days": None}, id="call_2")
PATCH = ToolCall("edit_file", {
    "path": "a.py", "patch": {"old": "x = 1\n", "new": "x = 2\n"}, "lines": [1, 2], "force": True, "ratio": 0.5,
    "text": "line one\nline two\n", "count": 3,
}, id="call_3")
PNG = Media(b"\x89PNG fake image one", "image/png")
JPEG = Media(b"\xff\xd8 fake image two", "image/jpeg")

SCENARIOS = {
    "plain": [Message("user", "Hello!")],
    "system": [Message("system", "Be terse."), Message("user", "Hi")],
    "empty-system": [Message("system", ""), Message("user", "Hi")],
    "developer-first": [Message("developer", "Answer in French."), Message("user", "Hi")],
    "multi-turn": [Message("system", "Be terse."), Message("user", "Hi"), Message("assistant", "Hey."),
                   Message("user", "  Spaces and\nnewlines  \n"), Message("assistant", "\nSure.\n"), Message("user", "Bye")],
    "reasoning-before-last-query": [Message("user", "2+2?"), Message("assistant", "4", thinking="Add them."),
                                    Message("user", "3+3?")],
    "reasoning-in-content": [Message("user", "2+2?"), Message("assistant", "<think>\nAdd.\n</think>\n\n4"),
                             Message("user", "3+3?"), Message("assistant", "<think>\nAdd again.\n</think>\n\n6")],
    "reasoning-after-last-query": [Message("user", "Weather in Paris and Köln?"),
                                   Message("assistant", "", thinking="\nTwo cities.\n", tool_calls=[PARIS, KOELN]),
                                   Message("tool", "21 C", tool_call_id="call_1"),
                                   Message("tool", '{"temp": 19}', tool_call_id="call_2"),
                                   Message("assistant", "Paris 21, Köln 19.", thinking="Both answered.")],
    "last-assistant-without-reasoning": [Message("user", "Hi"), Message("assistant", "Hello")],
    "tool-calls-with-content": [Message("system", "Use tools."), Message("user", "Fix a.py"),
                                Message("assistant", " Let me edit it.\n", tool_calls=[PATCH, PARIS]),
                                Message("tool", "ok", tool_name="edit_file"),
                                Message("tool", "sunny", tool_name="get_weather"),
                                Message("user", "Thanks"),
                                Message("assistant", "You're welcome.", thinking="Polite."),
                                Message("user", "Again?")],
    "tool-results-then-generation": [Message("user", "Weather?"),
                                     Message("assistant", "", thinking="Call it.", tool_calls=[PARIS]),
                                     Message("tool", "  21 C\n", tool_call_id="call_1")],
    "blank-content-with-calls": [Message("user", "Weather?"), Message("assistant", " \n", tool_calls=[PARIS, KOELN]),
                                 Message("tool", "21 C", tool_call_id="call_1"), Message("tool", "", tool_call_id="call_2"),
                                 Message("user", "Thanks")],
    "tool-response-as-user": [Message("user", "Weather?"),
                              Message("assistant", "", thinking="Call it.", tool_calls=[PARIS]),
                              Message("user", "<tool_response>\n21 C\n</tool_response>")],
    "late-system": [Message("system", "Be terse."), Message("user", "Weather?"),
                    Message("assistant", "", thinking="Call it.", tool_calls=[PARIS]),
                    Message("tool", "21 C", tool_call_id="call_1"),
                    Message("system", "The user is in a hurry."),
                    Message("assistant", "21 C.", thinking="Answer fast.")],
    "late-developer": [Message("user", "Hi"), Message("assistant", "Hello"), Message("developer", "Now be formal."),
                       Message("user", "Bye")],
}
WITH_TOOLS = {"tool-calls-with-content", "blank-content-with-calls", "tool-results-then-generation",
              "reasoning-after-last-query", "late-system", "system", "tool-response-as-user", "empty-system"}
LATE_SYSTEM = {"late-system", "late-developer"}


def upstream(template: str, messages: list[Message], tools: list[Tool], think) -> str:
    """The upstream template's rendering; Qwen has no developer role, so developer turns go in as system turns."""
    as_system = [Message("system", m.content) if m.role == "developer" else m for m in messages]
    if not any(m.images for m in messages):
        model = ModelFiles(config={}, chat_template=(TEMPLATES / template).read_text())
        return jinja_renderer.render(RenderRequest(model, as_system, tools, think)).text
    # The built-in renderer passes content as a string; images need the list form transformers gives templates.
    conversation = []
    for message in as_system:
        entry = jinja_renderer.message_dict(message)
        if message.images:
            entry["content"] = [{"type": "image"} for _ in message.images] + [{"type": "text", "text": message.content}]
        conversation.append(entry)
    extra = {} if think is None else {"enable_thinking": bool(think)}
    return render_jinja_template(conversations=[conversation], tools=[tool_dict(t) for t in tools] or None,
                                 chat_template=(TEMPLATES / template).read_text(), add_generation_prompt=True,
                                 **extra)[0][0]


def ours(name: str, template: str, messages, tools=(), think=None):
    model = ModelFiles(config={}, chat_template=(TEMPLATES / template).read_text())
    return RENDERER[name].render(RenderRequest(model, messages, list(tools), think))


# Where upstream refuses a late system message, test_late_system_messages_are_rendered_in_place has our output.
MATRIX = [(name, template, scenario) for name, template in PAIRS for scenario in sorted(SCENARIOS)
          if not (scenario in LATE_SYSTEM and name in REFUSES_LATE_SYSTEM)]


@pytest.mark.parametrize(("name", "template", "scenario"), MATRIX)
@pytest.mark.parametrize("think", [None, False, True, "high"])
def test_matches_the_upstream_template(name, template, scenario, think):
    messages = SCENARIOS[scenario]
    tools = TOOLS if scenario in WITH_TOOLS else []
    assert ours(name, template, messages, tools, think).text == upstream(template, messages, tools, think)


@pytest.mark.parametrize(("name", "template"), [pair for pair in PAIRS if pair[0] in VISION])
@pytest.mark.parametrize("think", [None, False])
def test_images_come_before_the_text_and_are_listed_in_order(name, template, think):
    messages = [Message("system", "Look closely."), Message("user", "What is this?", images=[PNG, JPEG]),
                Message("assistant", "Two pictures."), Message("user", "And this one?", images=[JPEG]),
                Message("user", "", images=[PNG])]
    prompt = ours(name, template, messages, [WEATHER], think)
    assert prompt.text == upstream(template, messages, [WEATHER], think)
    assert prompt.text.count("<|vision_start|><|image_pad|><|vision_end|>") == 4
    assert prompt.media == [PNG, JPEG, JPEG, PNG]


@pytest.mark.parametrize(("name", "template"), [pair for pair in PAIRS if pair[0] not in VISION])
def test_text_only_families_refuse_images(name, template):
    with pytest.raises(ValueError, match="take no images"):
        ours(name, template, [Message("user", "What is this?", images=[PNG])])


def test_qwen35_refuses_images_in_a_system_message():
    with pytest.raises(ValueError, match="system message cannot contain images"):
        ours("qwen3.5", "qwen3.5.jinja", [Message("system", "x", images=[PNG]), Message("user", "Hi")])


LATE_SYSTEM_QWEN35 = (
    "<|im_start|>system\nBe terse.<|im_end|>\n"
    "<|im_start|>user\nWeather?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nCall it.\n</think>\n\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n"
    "</parameter>\n</function>\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>\n"
    "<|im_start|>system\nThe user is in a hurry.<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nAnswer fast.\n</think>\n\n21 C.<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n"
)


@pytest.mark.parametrize("name", sorted(REFUSES_LATE_SYSTEM))
def test_late_system_messages_are_rendered_in_place(name):
    template = TEMPLATES_OF[name][0]
    with pytest.raises(Exception, match="System message must be at the beginning"):
        upstream(template, SCENARIOS["late-system"], [], True)
    # In place, not hoisted; and not a user query: reasoning after the last real query is still kept.
    assert ours(name, template, SCENARIOS["late-system"], think=True).text == LATE_SYSTEM_QWEN35
    late_developer = ours(name, template, SCENARIOS["late-developer"], think=True).text
    assert late_developer == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
        "<|im_start|>system\nNow be formal.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


@pytest.mark.parametrize("name", sorted(VISION))
def test_a_conversation_without_a_user_query_renders_without_reasoning(name):
    # Upstream raises "No user query found in messages."; a prefilled assistant turn is still a valid request.
    messages = [Message("system", "S"), Message("assistant", "Hi", thinking="greet")]
    text = ours(name, TEMPLATES_OF[name][0], messages, think=True).text
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>assistant\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"


@pytest.mark.parametrize("name", sorted(RENDERER))
def test_unknown_roles_and_unanswered_tool_results_are_refused(name):
    template = TEMPLATES_OF[name][0]
    with pytest.raises(ValueError, match="role 'critic'"):
        ours(name, template, [Message("user", "Hi"), Message("critic", "Meh")])
    with pytest.raises(ValueError, match="call_9"):
        ours(name, template, [Message("user", "Hi"), Message("assistant", "", tool_calls=[PARIS]),
                              Message("tool", "21 C", tool_call_id="call_9")])
    with pytest.raises(ValueError, match="get_weather"):
        ours(name, template, [Message("user", "Hi"), Message("tool", "21 C", tool_name="get_weather")])
