"""Conversations shared by the renderer tests, and the upstream templates rendered the way transformers does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from plugd.builtins import jinja_renderer
from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.types import Message, Think, Tool, ToolCall

TEMPLATES = Path(__file__).resolve().parents[3] / "tests/reference/chat_templates"

WEATHER = Tool(
    "get_weather",
    "  Current weather for a city.\n",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": " The city "},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city"],
    },
)
SEARCH = Tool(
    "search_files",
    "Search the workspace.",
    {
        "type": "object",
        "properties": {
            "pattern": {"type": ["string", "null"], "description": "A glob"},
            "limit": {"type": "number"},
            "recursive": {"type": "boolean", "default": False},
            "paths": {"type": "array", "items": {"type": "string"}},
            "filters": {"type": "object", "properties": {"size": {"type": "integer"}}, "additionalProperties": True},
        },
        "required": ["pattern", "paths"],
        "additionalProperties": False,
    },
)
BARE = Tool("ping")
TOOLS = [WEATHER, SEARCH, BARE]

PARIS = ToolCall("get_weather", {"city": "Paris", "unit": "celsius", "days": 3}, id="call_1")
LYON = ToolCall("get_weather", {"city": "Lyon — ville"}, id="call_2")
FILES = ToolCall(
    "search_files",
    {"pattern": None, "limit": 2.5, "recursive": True, "paths": ["src", "tests"], "filters": {"size": 10}},
    id="call_3",
)
PING = ToolCall("ping", {}, id="call_4")

SCENARIOS: dict[str, tuple[list[Message], list[Tool]]] = {
    "user only": ([Message("user", "Hello!")], []),
    "system and user": ([Message("system", "You are terse."), Message("user", "  Hi there  ")], []),
    "multi-turn": (
        [
            Message("system", "Be kind."),
            Message("user", "What is 2+2?"),
            Message("assistant", "4"),
            Message("user", "And 3+3?"),
            Message("assistant", "  6 \n"),
            Message("user", "Thanks"),
        ],
        [],
    ),
    "tools without system": ([Message("user", "Weather in Paris?")], TOOLS),
    "tools with system": ([Message("system", "Use tools."), Message("user", "Weather in Paris?")], TOOLS),
    "agent loop": (
        [
            Message("system", "You are an agent."),
            Message("user", "Compare Paris and Lyon, then find files."),
            Message("assistant", "Checking both.", tool_calls=[PARIS, LYON]),
            Message("tool", '{"temp": 21}', tool_call_id="call_1"),
            Message("tool", '{"temp": 19}', tool_call_id="call_2"),
            Message("assistant", "", tool_calls=[FILES, PING]),
            Message("tool", "a.py\nb.py", tool_name="search_files"),
            Message("tool", "pong", tool_name="ping"),
        ],
        TOOLS,
    ),
    "agent loop then answer and new question": (
        [
            Message("user", "Weather in Paris?"),
            Message("assistant", "", thinking="Need the tool.", tool_calls=[PARIS]),
            Message("tool", "sunny", tool_call_id="call_1"),
            Message("assistant", "It is sunny.", thinking="The tool said sunny."),
            Message("user", "And Lyon?"),
            Message("assistant", "Let me check.", thinking="Again the tool.", tool_calls=[LYON]),
            Message("tool", "rain"),
        ],
        TOOLS,
    ),
    "reasoning in history": (
        [
            Message("user", "Q1"),
            Message("assistant", "A1", thinking="thought one"),
            Message("user", "Q2"),
            Message("assistant", "<think>\ninline thought\n</think>\n\nA2"),
            Message("assistant", "A3", thinking="   "),
        ],
        [],
    ),
    "inline think before the last user turn": (
        [
            Message("user", "Q1"),
            Message("assistant", "<think>t1</think>A1"),
            Message("assistant", "<think>unclosed A", tool_calls=[PING]),
            Message("tool", "pong"),
            Message("assistant", "x</think>y</think>z", tool_calls=[PING]),
            Message("tool", "pong"),
            Message("user", "Q2"),
        ],
        [BARE],
    ),
    "final assistant message": (
        [Message("system", "S"), Message("user", "Write a haiku."), Message("assistant", "  Autumn moon,  ")],
        [],
    ),
    "final assistant message with reasoning": (
        [Message("user", "Hi"), Message("assistant", "<think>hmm</think> Hello", thinking="deep")],
        [],
    ),
    "think markers": (
        [
            Message("system", "Be brief. /no_think"),
            Message("user", "/think Explain gravity. "),
            Message("assistant", "Mass attracts."),
            Message("user", "Shorter /no_think please"),
        ],
        [],
    ),
    "system marker only": ([Message("system", "/no_think"), Message("user", "Hi")], [BARE]),
    "empty system": ([Message("system", ""), Message("user", "Hi")], [WEATHER]),
}

THINKS: list[Think] = [None, True, False, "high"]


def _template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def _with_think_marker(messages: list[Message], think: Think) -> list[Message]:
    """Nano v2's template reads `think` only as a /think or /no_think marker; the last user or system one wins."""
    if think is None:
        return messages
    last = max(i for i, m in enumerate(messages) if m.role in ("user", "system"))
    content = messages[last].content.replace("/think", "").replace("/no_think", "")
    marked = attrs.evolve(messages[last], content=content + (" /think" if think else " /no_think"))
    return messages[:last] + [marked] + messages[last + 1:]


def _upstream(template_name: str, messages: list[Message], tools: list[Tool] = (), think: Think = None) -> str:
    if template_name == "nemotron-nano-v2":
        messages = _with_think_marker(messages, think)
    model = ModelFiles(config={}, chat_template=_template(template_name), tokenizer_config={})
    return jinja_renderer.render(RenderRequest(model, messages, tools, think)).text


@pytest.fixture(scope="session")
def upstream() -> Callable[..., str]:
    """upstream(template_name, messages, tools=(), think=None): the template's output as transformers renders it.

    For nemotron-nano-v2, whose template has no enable_thinking, `think` becomes a marker in the conversation.
    """
    return _upstream


@pytest.fixture(params=sorted(SCENARIOS))
def scenario(request) -> tuple[list[Message], list[Tool]]:
    messages, tools = SCENARIOS[request.param]
    return list(messages), list(tools)


@pytest.fixture(params=THINKS, ids=repr)
def think(request) -> Think:
    return request.param
