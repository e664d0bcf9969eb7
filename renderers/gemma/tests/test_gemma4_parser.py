"""Gemma 4 output parser: thinking, content and native tool calls, whole or split anywhere, and its errors."""

from __future__ import annotations

import random

import pytest

from plugd import plugins
from plugd.hookspecs import ParsedPiece, RenderRequest
from plugd.types import Message, Tool, ToolCall
from plugd_render_gemma import GEMMA4_TEMPLATES, gemma4_parser
from plugd_render_gemma.gemma4_parser import CLOSE_CALL

Q = '<|"|>'
THINKING_ON = "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
THINKING_OFF = "<bos><|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
AFTER_RESULTS = "<|tool_response>response:ping{value:<|\"|>pong<|\"|>}<tool_response|><|channel>thought\n"


def _merged(pieces: list[ParsedPiece]) -> list[tuple]:
    """Pieces as (kind, text or call), adjacent text of one kind joined: how a client sees the stream."""
    merged: list[tuple] = []
    for piece in pieces:
        if piece.kind == "tool_call":
            call = piece.tool_call
            merged.append(("tool_call", call.name, call.arguments, call.id))
        elif merged and merged[-1][0] == piece.kind:
            merged[-1] = (piece.kind, merged[-1][1] + piece.text)
        else:
            merged.append((piece.kind, piece.text))
    return merged


def _parse(chunks, prompt: str = THINKING_ON) -> list[tuple]:
    parser = gemma4_parser.create([], prompt)
    pieces = [piece for chunk in chunks for piece in parser.feed(chunk)]
    return _merged(pieces + parser.finish())


def _splits(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12)))) if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def _call(name, **arguments):
    return ("tool_call", name, arguments, None)


CASES = {
    "plain content": ("Hello there.\nHow are you?", THINKING_OFF, [("content", "Hello there.\nHow are you?")]),
    "thinking then content": (
        "<|channel>thought\nLet me think.\nTwo plus two.\n<channel|>\n\nIt is 4.",
        THINKING_ON,
        [("thinking", "Let me think.\nTwo plus two."), ("content", "It is 4.")],
    ),
    "prompt opened the thought channel": (
        "The tool said pong.\n<channel|>Pong received.",
        AFTER_RESULTS,
        [("thinking", "The tool said pong."), ("content", "Pong received.")],
    ),
    "prompt opened the channel without a name": ("thought\nHm.<channel|>Ok", "<|turn>model\n<|channel>",
                                                  [("thinking", "Hm."), ("content", "Ok")]),
    "channel without the thought name": ("<|channel>plan: call it<channel|>Ok", THINKING_ON,
                                         [("thinking", "plan: call it"), ("content", "Ok")]),
    "one call": (
        f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:3}}<tool_call|>",
        THINKING_OFF,
        [_call("get_weather", city="Paris", days=3)],
    ),
    "thinking, text and several calls, then the turn ends": (
        f"<|channel>thought\nTwo cities.<channel|>Checking both.\n<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}"
        f"<tool_call|><|tool_call>call:get_weather{{city:{Q}Lyon{Q}}}<tool_call|><tool_call|><|tool_call>call:ping{{}}"
        "<tool_call|><|tool_response>response:ping{value:made up}<tool_response|>",
        THINKING_ON,
        [("thinking", "Two cities."), ("content", "Checking both."), _call("get_weather", city="Paris"),
         _call("get_weather", city="Lyon"), _call("ping")],
    ),
    "argument types": (
        "<|tool_call>call:record{"
        f"text:{Q}a, b}} {{c}} <tool_call|> <|channel> <turn|>\nline two{Q},empty:{Q}{Q},count:-12,ratio:2.5e-3,"
        f"whole:1.0,yes:true,no:false,nothing:null,legacy:None,list:[1,{Q}two{Q},[],{{}}],"
        f"nested:{{Inner:{{deep:[true,null]}},key:{Q}é{Q}}},bare:maybe}}<tool_call|>",
        THINKING_OFF,
        [_call("record", text="a, b} {c} <tool_call|> <|channel> <turn|>\nline two", empty="", count=-12, ratio=0.0025,
               whole=1.0, yes=True, no=False, nothing=None, legacy=None, list=[1, "two", [], {}],
               nested={"Inner": {"deep": [True, None]}, "key": "é"}, bare="maybe")],
    ),
    "spaces the template never writes": (
        f"<|tool_call> call: lookup {{ a : 1 , b : [ 1 , 2 ] , {Q}quoted key{Q}: {Q} x {Q} }} <tool_call|>",
        THINKING_OFF,
        [_call("lookup", a=1, b=[1, 2], **{"quoted key": " x "})],
    ),
    "content after a call": (f"<|tool_call>call:ping{{}}<tool_call|>\n\nDone, {Q}quoted{Q}.", THINKING_OFF,
                             [_call("ping"), ("content", f"Done, {Q}quoted{Q}.")]),
    "stray closers are dropped": ("Hello<channel|> world<tool_call|>!", THINKING_OFF, [("content", "Hello world!")]),
    "the end of the turn ends the answer": ("Bye.<turn|><|turn>user\nmore", THINKING_OFF, [("content", "Bye.")]),
    "a call the stream ended before closing": (f"<|tool_call>call:ping{{n:{Q}1{Q}}}", THINKING_OFF, [_call("ping", n="1")]),
    "a call the turn end closed": ("<|tool_call>call:ping{}<|tool_response>", THINKING_OFF, [_call("ping")]),
    "unclosed thinking": ("<|channel>thought\nStill going  ", THINKING_ON, [("thinking", "Still going")]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_parses_whole_char_by_char_and_split_anywhere(case):
    text, prompt, expected = CASES[case]
    assert _parse([text], prompt) == expected
    assert _parse(list(text), prompt) == expected
    for seed in range(20):
        assert _parse(_splits(text, seed), prompt) == expected


ERRORS = {
    "stream ended inside a call": "<|tool_call>call:get_weather{city:",
    "stream ended inside a string": f"<|tool_call>call:get_weather{{city:{Q}Par",
    "missing value": "<|tool_call>call:f{a:}<tool_call|>",
    "missing call prefix": "<|tool_call>get_weather{}<tool_call|>",
    "missing name": "<|tool_call>call:{a:1}<tool_call|>",
    "text after the arguments": "<|tool_call>call:f{a:1} and more<tool_call|>",
    "missing comma": f"<|tool_call>call:f{{a:1 b:{Q}x{Q}}}<tool_call|>",
    "unbalanced": "<|tool_call>call:f{a:[1,2}<tool_call|>",
    "a channel inside a call": "<|tool_call>call:f{a:<|channel>thought\n}<tool_call|>",
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_unreadable_calls_come_back_as_the_text_written(case, caplog):
    text = ERRORS[case]
    if case == "a channel inside a call":  # the call is over at the tag: the <tool_call|> after it is a stray closer
        expected = text.removesuffix(CLOSE_CALL)
    else:
        expected = text
    for chunks in ([text], list(text), _splits(text, 7)):
        assert _parse(chunks, THINKING_OFF) == [("content", expected)]
    assert "passed on as content" in caplog.text


def test_output_after_an_unreadable_call_is_still_parsed():
    text = "<|tool_call>call:f{a:}<tool_call|>Then <|tool_call>call:f{a:1}<tool_call|>"
    assert _parse([text], THINKING_OFF) == [("content", "<|tool_call>call:f{a:}<tool_call|>Then"),
                                            ("tool_call", "f", {"a": 1}, None)]


ARGUMENT_SETS = [
    {"city": "Paris", "days": 3},
    {"pattern": None, "Limit": 2.5, "paths": ["src", "tests"], "flags": {"Big": True, "a": [1, {"b": None}]}},
    {"text": "quotes \" and 'single', braces {} [] and: colons, commas", "n": -1e-05, "empty": {}, "none": []},
    {"unicode": "日本語 — ünïcödé", "multi": "line one\nline two\n", "zero": 0, "false": False},
]


@pytest.mark.parametrize("template", ["gemma4", "gemma4-31b-2026-04"])
def test_reads_back_the_calls_the_template_writes(template, upstream):
    calls = [ToolCall(f"tool_{i}", arguments, id=f"c{i}") for i, arguments in enumerate(ARGUMENT_SETS)]
    history = upstream(template, [Message("user", "Go"), Message("assistant", "", tool_calls=calls)])
    written = history[history.index("<|tool_call>") : history.rindex("<tool_call|>") + len("<tool_call|>")]
    expected = [_call(c.name, **c.arguments) for c in calls]
    assert _parse([written], THINKING_OFF) == expected
    assert _parse(list(written), THINKING_OFF) == expected


def test_starts_in_thinking_exactly_when_the_renderer_opened_the_channel(files):
    messages = [Message("user", "Ping"), Message("assistant", "", tool_calls=[ToolCall("ping", id="p")]),
                Message("tool", "pong", tool_call_id="p")]
    tools = [Tool("ping")]
    for think, expected in ((True, [("thinking", "Got pong."), ("content", "Pong!")]),
                            (False, [("content", "Got pong.Pong!")])):
        request = RenderRequest(files("gemma4"), messages, tools, think)
        prompt = GEMMA4_TEMPLATES["gemma4"].render(request).text
        assert _parse(["Got pong.<channel|>Pong!"], prompt) == expected


def test_the_registered_parser_is_this_one():
    parser = plugins.load().parsers()["gemma4"].create([Tool("ping")], THINKING_OFF)
    assert _merged(parser.feed("<|tool_call>call:ping{}<tool_call|>") + parser.finish()) == [_call("ping")]
