"""The streaming output parsers: thinking, content and tool calls, however the text is cut into pieces."""

from __future__ import annotations

import random

import pytest

from plugd.hookspecs import ModelFiles, ParsedPiece, RenderRequest
from plugd.types import Message, Tool, ToolCall
from plugd_render_nemotron import nano3, nano_v2
from plugd_render_nemotron.parsers import nano3_parser, nano_v2_parser

WEATHER = Tool("get_weather", "", {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "scale": {"type": "number"},
    "detailed": {"type": "boolean"}, "hours": {"type": "array"}, "where": {"type": "object"},
    "zip": {"type": "string"}, "note": {"type": ["string", "null"]}}})
TOOLS = [WEATHER]
QUESTION = [Message("user", "Weather in Paris?")]


def prompt(family, think=None, tools=TOOLS) -> str:
    return family.render(RenderRequest(ModelFiles(config={}), QUESTION, tools, think)).text


def merged(pieces: list[ParsedPiece]) -> list[tuple[str, object]]:
    """Pieces with neighbouring text of one kind joined: what a client sees once the stream is over."""
    out: list[tuple[str, object]] = []
    for piece in pieces:
        if piece.kind == "tool_call":
            out.append(("tool_call", piece.tool_call))
        elif out and out[-1][0] == piece.kind:
            out[-1] = (piece.kind, out[-1][1] + piece.text)
        else:
            out.append((piece.kind, piece.text))
    return out


def parse(create, tools, prompt_text: str, chunks: list[str]) -> list[tuple[str, object]]:
    parser = create(tools, prompt_text)
    pieces = [p for chunk in chunks for p in parser.feed(chunk)]
    return merged(pieces + parser.finish())


def random_chunks(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, len(text) // 2 + 1))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


V2_CALLS = ('Paris it is.\n</think>\n\n<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
            '{"name": "get_weather", "arguments": "{\\"city\\": \\"Lyon\\"}"}]</TOOLCALL>')
NANO3_CALLS = ("The user wants Paris.\n</think>\nLet me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
               "Paris\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=scale>\n1.5\n</parameter>\n"
               "<parameter=detailed>\nTrue\n</parameter>\n<parameter=hours>\n[9, 12]\n</parameter>\n"
               '<parameter=where>\n{"lat": 48.8}\n</parameter>\n<parameter=zip>\n75001\n</parameter>\n'
               "<parameter=note>\n  two\nlines  \n</parameter>\n</function>\n</tool_call>\n"
               "<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n</function>\n</tool_call>")

CASES = {
    "v2 thinking then answer": (nano_v2_parser, TOOLS, prompt(nano_v2), "  Hmm,\n2+2.\n\n</think>\n\nIt is 4.\n"),
    "v2 calls": (nano_v2_parser, TOOLS, prompt(nano_v2), V2_CALLS),
    "v2 answer, thinking off": (nano_v2_parser, TOOLS, prompt(nano_v2, think=False), "Sure.\n<TOOLCALL>[]</TOOLCALL>"),
    "nano3 calls": (nano3_parser, TOOLS, prompt(nano3), NANO3_CALLS),
    "nano3 answer, thinking off": (nano3_parser, TOOLS, prompt(nano3, think=False), "a <b> c </think> d\n\n"),
    "nano3 model opens thinking": (nano3_parser, [], "<|im_start|>assistant\n", "<think>\nx\n</think>\n\ny < z"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_any_split_parses_as_the_whole(case):
    create, tools, prompt_text, output = CASES[case]
    whole = parse(create, tools, prompt_text, [output])
    assert parse(create, tools, prompt_text, list(output)) == whole
    rng = random.Random(case)
    for _ in range(30):
        assert parse(create, tools, prompt_text, random_chunks(output, rng)) == whole


def test_v2_thinking_opened_by_the_prompt():
    assert parse(nano_v2_parser, TOOLS, prompt(nano_v2), list(CASES["v2 thinking then answer"][3])) == [
        ("thinking", "Hmm,\n2+2."), ("content", "It is 4.")]


def test_v2_several_calls_in_one_block():
    assert parse(nano_v2_parser, TOOLS, prompt(nano_v2), [V2_CALLS]) == [
        ("thinking", "Paris it is."),
        ("tool_call", ToolCall("get_weather", {"city": "Paris", "days": 2})),
        ("tool_call", ToolCall("get_weather", {"city": "Lyon"})),
    ]


def test_v2_prompt_that_closed_thinking_starts_in_content():
    assert parse(nano_v2_parser, TOOLS, prompt(nano_v2, think=False), ["Sure.\n", "<TOOLCALL>[]</TOOLCALL>"]) == [
        ("content", "Sure.")]
    assert parse(nano_v2_parser, TOOLS, prompt(nano_v2, think=False), ["4</think> done"]) == [
        ("content", "4</think> done")]


def test_v2_content_after_a_call_and_blank_lines_between_calls():
    output = 'A<TOOLCALL>[{"name": "get_weather", "arguments": {}}]</TOOLCALL>\n\n<TOOLCALL>[{"name": "ping"}]</TOOLCALL>\n B'
    assert parse(nano_v2_parser, TOOLS, "", [output]) == [
        ("content", "A"), ("tool_call", ToolCall("get_weather", {})), ("tool_call", ToolCall("ping", {})),
        ("content", "B")]


def test_call_tags_are_text_when_no_tools_were_offered():
    output = '<TOOLCALL>[{"name": "get_weather"}]</TOOLCALL>'
    assert parse(nano_v2_parser, [], prompt(nano_v2, think=False, tools=[]), [output]) == [("content", output)]


@pytest.mark.parametrize(("output", "error"), [
    ("<TOOLCALL>[{\"name\": \"get_weather\", ", "unclosed <TOOLCALL>"),
    ("<TOOLCALL>[{\"name\": get_weather}]</TOOLCALL>", "not valid JSON"),
    ("<TOOLCALL>[{\"arguments\": {}}]</TOOLCALL>", "must be an object with a \"name\""),
    ("<TOOLCALL>[{\"name\": \"f\", \"arguments\": [1]}]</TOOLCALL>", "arguments of the call to 'f' are not a JSON object"),
    ("<TOOLCALL>[{\"name\": \"f\", \"arguments\": \"{oops\"}]</TOOLCALL>", "arguments of the call to 'f' are not valid"),
])
def test_v2_unreadable_calls_come_back_as_the_text_written(output, error, caplog):
    assert parse(nano_v2_parser, TOOLS, "", [output]) == [("content", output)]
    assert error in caplog.text and "passed on as content" in caplog.text


def test_nano3_calls_typed_by_schema():
    assert parse(nano3_parser, TOOLS, prompt(nano3), [NANO3_CALLS]) == [
        ("thinking", "The user wants Paris."),
        ("content", "Let me look."),
        ("tool_call", ToolCall("get_weather", {
            "city": "Paris", "days": 3, "scale": 1.5, "detailed": True, "hours": [9, 12], "where": {"lat": 48.8},
            "zip": "75001", "note": "  two\nlines  "})),
        ("tool_call", ToolCall("get_weather", {"city": "Lyon"})),
    ]


def test_nano3_unknown_tool_or_parameter_keeps_strings():
    output = "<tool_call>\n<function=other>\n<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>" \
             "<tool_call><function=get_weather><parameter=extra>7</parameter></function></tool_call>"
    assert parse(nano3_parser, TOOLS, "", [output]) == [
        ("tool_call", ToolCall("other", {"n": "5"})), ("tool_call", ToolCall("get_weather", {"extra": "7"}))]


def test_nano3_prompt_states():
    assert parse(nano3_parser, TOOLS, prompt(nano3), ["\nthinking\n</think>\n\nanswer"]) == [
        ("thinking", "thinking"), ("content", "answer")]
    assert parse(nano3_parser, TOOLS, prompt(nano3, think=False), ["\n\nanswer\n"]) == [("content", "answer")]


def test_calls_have_no_id():
    parser = nano3_parser(TOOLS, "")
    pieces = parser.feed("<tool_call>\n<function=get_weather>\n</function>\n</tool_call>") + parser.finish()
    assert [p.tool_call.id for p in pieces] == [None]


@pytest.mark.parametrize(("output", "error"), [
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis", "unclosed <tool_call>"),
    ("<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>", "holds no <function=...>"),
    ("<tool_call>\n<function=get_weather>\ncity=Paris\n</function>\n</tool_call>", "unexpected text in the call"),
    ("<tool_call><function=get_weather><parameter=city>Paris</function></tool_call>", "unexpected text in the call"),
])
def test_nano3_unreadable_calls_come_back_as_the_text_written(output, error, caplog):
    assert parse(nano3_parser, TOOLS, "", [output]) == [("content", output)]
    assert error in caplog.text


def test_thinking_left_open_ends_as_thinking():
    parser = nano3_parser(TOOLS, prompt(nano3))
    assert merged(parser.feed("still thinking ") + parser.feed("<tool_call>") + parser.finish()) == [
        ("thinking", "still thinking <tool_call>")]
