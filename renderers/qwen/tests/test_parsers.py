"""The Qwen output parsers: thinking, content and tool calls, however the text is split as it streams."""

import random

import pytest

from plugd.types import Tool, ToolCall
from plugd_render_qwen.parsers import PARSERS

PARSER = {parser.name: parser for parser in PARSERS}
THINKING_PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
NO_THINKING_PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
PLAIN_PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"

WEATHER = Tool("get_weather", "Weather for a city", {"type": "object", "properties": {"city": {"type": "string"}}})
EDIT = Tool("edit", "Edit a file", {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "line": {"type": "integer"},
        "scale": {"type": "number"},
        "dry_run": {"type": "boolean"},
        "options": {"type": "object"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "note": {"type": ["string", "null"]},
    },
})


def merged(pieces):
    """Pieces as (kind, value) with adjacent text of one kind joined: how they read once streamed out."""
    out = []
    for piece in pieces:
        assert piece.text or piece.tool_call, "a parser never emits an empty piece"
        if piece.kind == "tool_call":
            assert piece.tool_call.id is None, "ids are the server's to assign"
            out.append(("tool_call", piece.tool_call))
        elif out and out[-1][0] == piece.kind:
            out[-1] = (piece.kind, out[-1][1] + piece.text)
        else:
            out.append((piece.kind, piece.text))
    return out


def parse(name, chunks, tools=(), prompt=PLAIN_PROMPT):
    parser = PARSER[name].create(list(tools), prompt)
    if isinstance(chunks, str):
        chunks = [chunks]
    pieces = []
    for chunk in chunks:
        pieces += parser.feed(chunk)
    return merged(pieces + parser.finish())


def call(name, **arguments):
    return ("tool_call", ToolCall(name, arguments))


# --- qwen3: <think> and Hermes JSON calls


def test_qwen3_thinking_the_model_opens_itself():
    text = "<think>\nFirst, 2+2.\n\nThat is 4.\n</think>\n\nIt is **4**."
    assert parse("qwen3", text) == [("thinking", "First, 2+2.\n\nThat is 4."), ("content", "It is **4**.")]


def test_qwen3_thinking_opened_by_the_prompt():
    assert parse("qwen3", "Hmm.\n</think>\n\nHello!", prompt=THINKING_PROMPT) == [("thinking", "Hmm."),
                                                                                  ("content", "Hello!")]


def test_qwen3_thinking_disabled_by_the_prompt_starts_as_content():
    assert parse("qwen3", "Hello! </think> <think>", prompt=NO_THINKING_PROMPT) == [("content", "Hello! </think> <think>")]


def test_a_think_tag_after_content_is_content():
    assert parse("qwen3", "Use <think> tags.\n") == [("content", "Use <think> tags.")]


def test_qwen3_hermes_calls_with_text_around_them():
    text = (
        "<think>\nI need the weather twice.\n</think>\n\nLet me check.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Köln"}}\n</tool_call>\n'
    )
    assert parse("qwen3", text, [WEATHER]) == [
        ("thinking", "I need the weather twice."),
        ("content", "Let me check."),
        call("get_weather", city="Paris"),
        call("get_weather", city="Köln"),
    ]


def test_text_between_and_after_calls_is_content():
    text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>\nand then\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\n\nDone.\n'
    )
    assert parse("qwen3", text, [WEATHER]) == [call("get_weather"), ("content", "and then"),
                                               call("get_weather", city="Rome"), ("content", "Done.")]


def test_a_tool_call_tag_inside_thinking_is_thinking():
    text = "<think>\nMaybe <tool_call> now?\n</think>\n\nNo."
    assert parse("qwen3", text, [WEATHER]) == [("thinking", "Maybe <tool_call> now?"), ("content", "No.")]


def test_arguments_written_as_a_json_string_are_read():
    text = '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}\n</tool_call>'
    assert parse("qwen3", text, [WEATHER]) == [call("get_weather", city="Oslo")]


def test_calls_are_read_when_no_tools_were_offered():
    text = '<tool_call>\n{"name": "anything", "arguments": {"x": 1}}\n</tool_call>'
    assert parse("qwen3", text) == [call("anything", x=1)]


def test_what_only_looked_like_the_start_of_a_tag_is_flushed_at_the_end():
    assert parse("qwen3", ["Hello <tool", "_ca"]) == [("content", "Hello <tool_ca")]
    assert parse("qwen3", ["<think>\nwhy </thi"], prompt=PLAIN_PROMPT) == [("thinking", "why </thi")]


def test_an_unfinished_thinking_block_is_not_an_error():
    assert parse("qwen3", "I was thinking", prompt=THINKING_PROMPT) == [("thinking", "I was thinking")]


@pytest.mark.parametrize(("text", "error"), [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}', "unclosed tool call"),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>', "not valid JSON"),
    ('<tool_call>\n{"name": "delete_everything", "arguments": {}}\n</tool_call>', "not among the tools"),
    ('<tool_call>\n{"arguments": {}}\n</tool_call>', "with a name"),
    ('<tool_call>\n["get_weather"]\n</tool_call>', "with a name"),
    ('<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>', "not a JSON object"),
    ('<tool_call>\n{"name": "get_weather", "arguments": "[1]"}\n</tool_call>', "not a JSON object"),
])
def test_qwen3_unreadable_calls_come_back_as_the_text_written(text, error, caplog):
    assert parse("qwen3", text, [WEATHER]) == [("content", text)]
    assert error in caplog.text and "passed on as content" in caplog.text


def test_output_after_an_unreadable_call_is_still_parsed():
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert parse("qwen3", [bad[:20], bad[20:] + "\n" + good], [WEATHER]) == [
        ("content", bad), call("get_weather", city="Paris")]


# --- qwen3-coder: XML calls typed by the tool's schema, no thinking

CODER_CALL = """I'll edit it.

<tool_call>
<function=edit>
<parameter=path>
src/app.py
</parameter>
<parameter=line>
42
</parameter>
<parameter=scale>
-1.5
</parameter>
<parameter=dry_run>
false
</parameter>
<parameter=options>
{"indent": 4, "tabs": false}
</parameter>
<parameter=tags>
["a", "b"]
</parameter>
<parameter=note>
first line
  second line

</parameter>
</function>
</tool_call>
<tool_call>
<function=get_weather>
<parameter=city>
42
</parameter>
</function>
</tool_call>"""


def test_coder_parameters_are_typed_by_the_schema():
    assert parse("qwen3-coder", CODER_CALL, [EDIT, WEATHER]) == [
        ("content", "I'll edit it."),
        call("edit", path="src/app.py", line=42, scale=-1.5, dry_run=False, options={"indent": 4, "tabs": False},
             tags=["a", "b"], note="first line\n  second line\n"),
        call("get_weather", city="42"),
    ]


def test_coder_parameters_of_unknown_tools_stay_strings():
    text = "<tool_call>\n<function=anything>\n<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>"
    assert parse("qwen3-coder", text) == [call("anything", n="7")]


def test_coder_has_no_thinking():
    assert parse("qwen3-coder", "<think>\nno\n</think>\n\nyes") == [("content", "<think>\nno\n</think>\n\nyes")]


@pytest.mark.parametrize(("text", "error"), [
    ("<tool_call>\n<function=edit>\n<parameter=path>\na\n</parameter>\n</function>\n", "unclosed tool call"),
    ("<tool_call>\n<parameter=path>\na\n</parameter>\n</tool_call>", "<function=...>"),
    ("<tool_call>\n<function=edit>\n<parameter=path>\na\n</parameter>\n</tool_call>", "<function=...>"),
    ("<tool_call>\n<function=edit>\nstray words\n<parameter=path>\na\n</parameter>\n</function>\n</tool_call>",
     "unexpected text"),
    ("<tool_call>\n<function=edit>\n<parameter=path>\na\n</function>\n</tool_call>", "unexpected text"),
    ("<tool_call>\n<function=rm>\n</function>\n</tool_call>", "not among the tools"),
])
def test_coder_unreadable_calls_come_back_as_the_text_written(text, error, caplog):
    assert parse("qwen3-coder", text, [EDIT]) == [("content", text)]
    assert error in caplog.text


# --- qwen3.5: thinking opened by the prompt, then XML calls


def test_qwen35_thinking_then_calls():
    text = ("The user wants weather.\n</think>\n\nChecking.\n\n"
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>")
    assert parse("qwen3.5", text, [WEATHER], prompt=THINKING_PROMPT) == [
        ("thinking", "The user wants weather."), ("content", "Checking."), call("get_weather", city="Paris")]


def test_qwen35_with_thinking_off_and_a_call_right_away():
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>"
    assert parse("qwen3.5", text, [WEATHER], prompt=NO_THINKING_PROMPT) == [call("get_weather", city="Rome")]


def test_an_empty_thinking_block_yields_no_thinking():
    assert parse("qwen3.5", "\n</think>\n\nHi", prompt=THINKING_PROMPT) == [("content", "Hi")]


# --- streaming: any split gives what the whole text gives

STREAMS = [
    ("qwen3", "<think>\nFirst, 2+2.\n\nThat is 4.\n</think>\n\nIt is **4**.\n\nBye.", [], PLAIN_PROMPT),
    ("qwen3", "Hmm <think>.\n</think>\n\n<tool_call>\n"
     '{"name": "get_weather", "arguments": {"city": "a</tool_call"}}\n</tool_call>\n\ntail <tool_', [WEATHER],
     THINKING_PROMPT),
    ("qwen3", "Lead \n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>\n \nx <<think>",
     [WEATHER], NO_THINKING_PROMPT),
    ("qwen3-coder", CODER_CALL + "\n\nAfter. <tool", [EDIT, WEATHER], PLAIN_PROMPT),
    ("qwen3.5", "Think\n\nmore \n</think>\n\n" + CODER_CALL, [EDIT, WEATHER], THINKING_PROMPT),
]


@pytest.mark.parametrize(("name", "text", "tools", "prompt"), STREAMS)
def test_random_splits_parse_like_the_whole_text(name, text, tools, prompt):
    whole = parse(name, text, tools, prompt)
    assert len(whole) > 1
    assert parse(name, list(text), tools, prompt) == whole
    rng = random.Random(f"{name}{len(text)}")
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(12, len(text) - 1))))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert parse(name, chunks, tools, prompt) == whole, chunks
