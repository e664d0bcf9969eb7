"""Each parser reads back what its family's renderer writes for an assistant turn: the format the model was taught."""

from pathlib import Path

import pytest

from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.types import Message, Tool, ToolCall
from plugd_render_qwen.parsers import PARSERS
from plugd_render_qwen.renderers import RENDERERS

TEMPLATES = Path(__file__).resolve().parents[3] / "tests/reference/chat_templates"
RENDERER = {renderer.name: renderer for renderer in RENDERERS}
PARSER = {parser.name: parser for parser in PARSERS}
FAMILIES = [  # renderer, its template, its parser, whether history keeps reasoning
    ("qwen3", "qwen3.jinja", "qwen3", True),
    ("qwen3-instruct", "qwen3-instruct-2507.jinja", "qwen3", False),
    ("qwen3-coder", "qwen3-coder.jinja", "qwen3-coder", False),
    ("qwen3.5", "qwen3.5.jinja", "qwen3.5", True),
    ("qwen3.5-nothink", "qwen3.5-nothink.jinja", "qwen3.5", True),
    ("qwen3.6", "qwen3.6.jinja", "qwen3.5", True),
]
EDIT = Tool("edit_file", "Edit a file", {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "line": {"type": "integer"},
        "scale": {"type": "number"},
        "force": {"type": "boolean"},
        "after": {"type": ["integer", "null"]},
        "patch": {"type": "object"},
        "lines": {"type": "array"},
        "text": {"type": "string"},
    },
})
CALLS = [
    ToolCall("edit_file", {"path": "src/main.py", "line": 7, "scale": 0.25, "force": True, "after": None,
                           "patch": {"old": "a", "new": ["b", 1]}, "lines": [1, 2, 3],
                           "text": "def f():\n    return 'é'\n"}),
    ToolCall("edit_file", {"path": "README.md", "force": False}),
]


@pytest.mark.parametrize(("renderer", "template", "parser", "keeps_reasoning"), FAMILIES)
def test_the_parser_reads_the_rendered_assistant_turn(renderer, template, parser, keeps_reasoning):
    model = ModelFiles(config={}, chat_template=(TEMPLATES / template).read_text())
    question = [Message("user", "Fix both files.")]
    answer = Message("assistant", "I'll fix both files.", thinking="Two edits are needed.\n\nFirst main.py.",
                     tool_calls=CALLS)

    def render(messages):
        return RENDERER[renderer].render(RenderRequest(model, messages, [EDIT], think=True)).text

    prompt = render(question)
    history = render(question + [answer])
    assert history.startswith(prompt)
    output = history[len(prompt):].split("<|im_end|>")[0]

    stream = PARSER[parser].create([EDIT], prompt)
    pieces = [piece for char in output for piece in stream.feed(char)] + stream.finish()
    thinking = "".join(p.text for p in pieces if p.kind == "thinking")
    content = "".join(p.text for p in pieces if p.kind == "content")
    calls = [p.tool_call for p in pieces if p.kind == "tool_call"]
    assert thinking == (answer.thinking if keeps_reasoning else "")
    assert content == answer.content
    assert calls == CALLS
