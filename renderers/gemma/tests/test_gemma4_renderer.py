"""Gemma 4 renderers: byte parity with the four upstream templates over a scenario matrix, and the documented departures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugd.hookspecs import RenderRequest
from plugd.types import Media, Message, Tool, ToolCall
from plugd_render_gemma import GEMMA4_TEMPLATES

TEMPLATE_FILES = {
    "gemma4": "gemma4",
    "gemma4-e2b": "gemma4-e2b",
    "gemma4-2026-04": "gemma4-31b-2026-04",
    "gemma4-e2b-2026-04": "gemma4-e2b-2026-04",
}
CAT, DOG = Media(b"cat-bytes", "image/png"), Media(b"dog-bytes", "image/jpeg")

WEATHER = Tool(
    "get_weather",
    "Current weather for a city.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit"},
            "days": {"type": "integer", "minimum": 1, "nullable": True},
        },
        "required": ["city"],
    },
)
SEARCH = Tool(
    "search_files",
    "Search the workspace.\nReturns paths.",
    {
        "type": "object",
        "properties": {
            "pattern": {"type": ["string", "null"], "description": "A glob"},
            "Limit": {"type": "number"},
            "paths": {"type": "array", "items": {"type": "string"}, "description": "Roots"},
            "hits": {
                "type": "array",
                "items": {"type": "object", "properties": {"path": {"type": "string"}, "line": {"type": "integer"}},
                          "required": ["path"], "default": None, "title": "Hit"},
            },
            "kinds": {"type": "array", "items": {"type": ["string", "integer"], "enum": ["a", 1]}},
            "filters": {"type": "object", "properties": {"size": {"type": "integer"}, "type": {"type": "string"}},
                        "required": ["size"]},
            "extra": {"type": "object", "additionalProperties": {"type": "string", "description": "value"},
                      "description": "Free-form"},
            "type": {"type": "string", "description": "a property named like a keyword"},
            "flag": {"type": "boolean", "default": False},
        },
        "required": ["pattern", "paths"],
        "additionalProperties": False,
    },
)
BARE = Tool("ping")
UNTYPED = Tool("note", "Take a note.", {"properties": {"text": {"type": "string"}}})
TOOLS = [WEATHER, SEARCH, BARE, UNTYPED]

PARIS = ToolCall("get_weather", {"city": "Paris", "unit": "celsius", "days": 3}, id="call_1")
LYON = ToolCall("get_weather", {"city": "Lyon — ville \"centre\""}, id="call_2")
FILES = ToolCall(
    "search_files",
    {"pattern": None, "Limit": 2.5, "paths": ["src", "tests"], "filters": {"size": 10, "Big": True, "a": [1, {"b": None}]},
     "flag": False},
    id="call_3",
)
PING = ToolCall("ping", {}, id="call_4")


def _result(call: ToolCall, content: str, **extra) -> Message:
    return Message("tool", content, tool_call_id=call.id, **extra)


SCENARIOS: dict[str, tuple[list[Message], list[Tool]]] = {
    "user only": ([Message("user", "Hello!")], []),
    "system and user": ([Message("system", "  You are terse. "), Message("user", "  Hi there  ")], []),
    "developer first": ([Message("developer", "Use tabs."), Message("user", "Hi")], []),
    "multi-turn": (
        [
            Message("system", "You are a poet."),
            Message("user", "Write a haiku."),
            Message("assistant", "  Autumn moonlight  ", thinking="Count syllables."),
            Message("user", "Another."),
        ],
        [],
    ),
    "tools offered": ([Message("user", "Weather in Paris?")], TOOLS),
    "system and tools": ([Message("system", "Be helpful."), Message("user", "Weather?")], [WEATHER]),
    "one call, result, answer": (
        [
            Message("user", "Weather in Paris?"),
            Message("assistant", "", thinking="I should call the tool.", tool_calls=[PARIS]),
            _result(PARIS, "Sunny, 21C"),
            Message("assistant", "It is sunny.", thinking="Now answer."),
        ],
        [WEATHER],
    ),
    "several calls, results pending answer": (
        [
            Message("system", "Use tools."),
            Message("user", "Paris, Lyon, and my files?"),
            Message("assistant", "Let me check.", thinking="Three calls.", tool_calls=[PARIS, LYON, FILES]),
            _result(LYON, "Rain"),
            _result(PARIS, '{"sky": "clear", "temp": 21}'),
            _result(FILES, "src/a.py\nsrc/b.py"),
        ],
        TOOLS,
    ),
    "results then user": (
        [
            Message("user", "Ping it"),
            Message("assistant", "", tool_calls=[PING]),
            Message("tool", "pong", tool_name="ping"),
            Message("user", "And again?"),
        ],
        [BARE],
    ),
    "call without result, then user": (
        [Message("user", "Ping it"), Message("assistant", "Calling.", tool_calls=[PING]), Message("user", "Never mind")],
        [BARE],
    ),
    "call without result at the end": ([Message("user", "Ping it"), Message("assistant", "", tool_calls=[PING])], [BARE]),
    "two tool rounds": (
        [
            Message("user", "Weather in Paris then Lyon"),
            Message("assistant", "", tool_calls=[PARIS]),
            _result(PARIS, "Sunny"),
            Message("assistant", "Now Lyon.", tool_calls=[LYON]),
            _result(LYON, "Rain"),
            Message("assistant", "Paris is sunny; Lyon is rainy."),
            Message("user", "Thanks"),
        ],
        [WEATHER],
    ),
    "images": ([Message("user", "What is this?", images=[CAT, DOG])], []),
    "images in a later turn": (
        [Message("user", "Hi"), Message("assistant", "Hello"), Message("user", "  And this?  ", images=[DOG])],
        [],
    ),
    "system after the first user turn": (
        [Message("user", "Fix it"), Message("system", " Reminder: run tests "), Message("assistant", "Done"),
         Message("system", "Be brief"), Message("user", "Thanks")],
        [],
    ),
    "assistant text with a thought channel": (
        [Message("user", "Hi"), Message("assistant", "<|channel>thought\nhmm<channel|>Hello  <|channel>more"),
         Message("user", "Again")],
        [],
    ),
    "consecutive assistant messages": (
        [Message("user", "Hi"), Message("assistant", "Hello."), Message("assistant", "  How can I help?")],
        [],
    ),
    "whitespace-only assistant after results": (
        [Message("user", "Ping"), Message("assistant", "", tool_calls=[PING]), _result(PING, "pong"),
         Message("assistant", "   ")],
        [BARE],
    ),
    "ends with an assistant message": ([Message("user", "Hi"), Message("assistant", "Hel")], []),
}
THINKS = [None, False, True, "high"]


def _render(renderer: str, messages, tools=(), think=None, files=None):
    template = GEMMA4_TEMPLATES[renderer]
    return template.render(RenderRequest(files(TEMPLATE_FILES[renderer]), messages, tools, think))


@pytest.mark.parametrize("think", THINKS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("renderer", list(TEMPLATE_FILES))
def test_matches_the_upstream_template(renderer, scenario, think, upstream, files):
    messages, tools = SCENARIOS[scenario]
    prompt = _render(renderer, messages, tools, think, files)
    assert prompt.text == upstream(TEMPLATE_FILES[renderer], messages, tools, think)
    assert prompt.media == [image for m in messages for image in m.images]


SCHEMAS = sorted((Path(__file__).resolve().parents[3] / "tests/reference/json_schemas").glob("*.json"))


def _schema_tool(path: Path) -> Tool:
    schema = json.loads(path.read_text())
    return Tool(path.stem, schema.get("description", "A real-world schema."), schema)


@pytest.mark.parametrize("renderer", ["gemma4", "gemma4-2026-04"])
def test_declares_real_world_schemas_as_upstream_does(renderer, upstream, files):
    """The JSONSchemaBench schemas as tool parameters: every quirk of the template's schema walk, at scale."""
    messages = [Message("user", "Hi")]
    assert len(SCHEMAS) >= 60
    for path in SCHEMAS:
        tools = [_schema_tool(path)]
        assert _render(renderer, messages, tools, files=files).text == upstream(TEMPLATE_FILES[renderer], messages, tools), path


def test_images_in_tool_results_follow_the_result(upstream, files):
    messages = [Message("user", "Screenshot please"), Message("assistant", "", tool_calls=[PING]),
                _result(PING, "here it is", images=[CAT, DOG]), Message("assistant", "A cat and a dog.", images=[])]
    for renderer in ("gemma4", "gemma4-e2b"):
        prompt = _render(renderer, messages, [BARE], files=files)
        assert prompt.text == upstream(TEMPLATE_FILES[renderer], messages, [BARE])
        assert "<|tool_response>response:ping{value:<|\"|>here it is<|\"|>}<tool_response|><|image|><|image|>" in prompt.text
        assert prompt.media == [CAT, DOG]
    with pytest.raises(ValueError, match="images in tool results"):
        _render("gemma4-2026-04", messages, [BARE], files=files)


def test_media_follow_prompt_order_not_message_order(files):
    """The template writes tool results (and their images) before the text and images of the calling message."""
    messages = [Message("user", "Go", images=[CAT]), Message("assistant", "Look", images=[DOG], tool_calls=[PING]),
                _result(PING, "shot", images=[CAT])]
    prompt = _render("gemma4", messages, [BARE], files=files)
    assert prompt.media == [CAT, CAT, DOG]
    assert prompt.text.index("shot") < prompt.text.index("Look")


def test_values_are_written_like_jinja_writes_them(upstream, files):
    call = ToolCall("note", {"b": 1e-05, "B": -3, "a": "x", "A": [True, None, 0.5], "é": {"Z": "z", "y": []}}, id="c")
    messages = [Message("user", "Hi"), Message("assistant", "", tool_calls=[call]), Message("tool", "ok", tool_call_id="c")]
    for renderer, file in TEMPLATE_FILES.items():
        assert _render(renderer, messages, [UNTYPED], files=files).text == upstream(file, messages, [UNTYPED])


def test_later_developer_message_is_a_system_turn(upstream, files):
    messages = [Message("user", "Hi"), Message("developer", "Answer in French."), Message("assistant", "Bonjour")]
    ours = _render("gemma4", messages, files=files).text
    assert "<|turn>system\nAnswer in French.<turn|>\n" in ours
    upstreams = upstream("gemma4", messages)
    assert "<|turn>developer\n" in upstreams
    assert ours == upstreams.replace("<|turn>developer\n", "<|turn>system\n")


def test_results_are_named_by_the_call_they_answer(upstream, files):
    """Calls without ids (Ollama's habit): the template names every result after the last call; plugd does not."""
    paris, ping = ToolCall("get_weather", {"city": "Paris"}), ToolCall("ping")
    messages = [Message("user", "Go"), Message("assistant", "", tool_calls=[paris, ping]),
                Message("tool", "Sunny", tool_name="get_weather"), Message("tool", "pong", tool_name="ping")]
    named = ("<|tool_response>response:get_weather{value:<|\"|>Sunny<|\"|>}<tool_response|>"
             "<|tool_response>response:ping{value:<|\"|>pong<|\"|>}<tool_response|>")
    assert named in _render("gemma4", messages, [WEATHER, BARE], files=files).text
    assert named not in upstream("gemma4", messages, [WEATHER, BARE])
    unnamed = messages[:2] + [Message("tool", "Sunny"), Message("tool", "pong")]
    assert named in _render("gemma4", unnamed, [WEATHER, BARE], files=files).text


def test_results_without_id_or_name_are_matched_by_position(upstream, files):
    messages = [Message("user", "Go"), Message("assistant", "", tool_calls=[PARIS, PING]),
                Message("tool", "Sunny"), Message("tool", "pong")]
    ours = _render("gemma4", messages, [WEATHER, BARE], files=files).text
    assert "response:get_weather{value:<|\"|>Sunny" in ours and "response:ping{value:<|\"|>pong" in ours
    assert "response:unknown{" in upstream("gemma4", messages, [WEATHER, BARE])


@pytest.mark.parametrize(
    "messages, complaint",
    [
        ([Message("robot", "beep")], "role 'robot'"),
        ([Message("user", "Hi"), Message("tool", "pong", tool_name="ping")], "'ping' does not follow"),
        ([Message("user", "Hi"), Message("assistant", "", tool_calls=[PING]), Message("user", "wait"),
          Message("tool", "pong", tool_call_id="call_4")], "'call_4' does not follow"),
        ([Message("user", "Hi"), Message("assistant", "", tool_calls=[PING]),
          Message("tool", "x", tool_call_id="call_9")], "'call_9' answers no tool call"),
        ([Message("user", "Hi"), Message("assistant", "", tool_calls=[PING]),
          Message("tool", "x", tool_name="get_weather")], "'get_weather' answers no tool call"),
        ([Message("user", "Hi"), Message("assistant", "", tool_calls=[PING]), Message("tool", "a"), Message("tool", "b")],
         "'#2' answers no tool call"),
        ([Message("system", "See", images=[CAT]), Message("user", "Hi")], "images in the leading system message"),
    ],
)
def test_refuses_what_it_cannot_render(messages, complaint, files):
    for renderer in TEMPLATE_FILES:
        with pytest.raises(ValueError, match=complaint):
            _render(renderer, messages, [BARE], files=files)
