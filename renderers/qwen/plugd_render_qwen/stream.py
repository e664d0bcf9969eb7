"""The streaming output parser shared by the Qwen families: optional thinking, content, and tool calls.

The families differ only in whether a response may open with a thinking
block and in how the body of a `<tool_call>` is written (Hermes JSON or XML),
so the state machine is one class and the call syntax is a function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from plugd.hookspecs import ParsedPiece
from plugd.parsing import ParseError, Tag, TagSplitter, unreadable_call
from plugd.types import Tool, ToolCall

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
TURN_START = "<|im_start|>"

CallReader = Callable[[str, Mapping[str, Tool]], ToolCall]
"""Reads the text between <tool_call> and </tool_call> as one call, given the offered tools by name."""


def prompt_opens_thinking(prompt: str) -> bool:
    """Whether the prompt's last turn (the generation prompt) left a <think> block open."""
    last_turn = prompt[max(prompt.rfind(TURN_START), 0) :]
    return last_turn.rfind(THINK_OPEN) > last_turn.rfind(THINK_CLOSE)


def answer_after(prompt: str) -> str | None:
    """Where a structured answer starts: after </think> when the prompt opened a thinking block, else at once."""
    return THINK_CLOSE if prompt_opens_thinking(prompt) else None


class QwenStreamParser:
    """Splits a Qwen response into thinking, content and tool calls as it streams.

    Whitespace the templates put around tags (the newline after <think>, the
    blank line after </think>, newlines around tool calls) is dropped: each
    thinking or content run loses its leading whitespace, and its trailing
    whitespace is held back until more text shows it was not the end of the run.
    """

    def __init__(self, tools: Sequence[Tool], prompt: str, *, read_call: CallReader, thinking: bool):
        tags = [CALL_OPEN, CALL_CLOSE] + ([THINK_OPEN, THINK_CLOSE] if thinking else [])
        self._splitter = TagSplitter(tags)
        self._tools = {tool.name: tool for tool in tools}
        self._read_call = read_call
        # "start" is content that may still turn out to open with a <think> block.
        self._state = "thinking" if thinking and prompt_opens_thinking(prompt) else "start"
        self._run_started = False
        self._held_space = ""
        self._call_body = ""

    def feed(self, text: str) -> list[ParsedPiece]:
        return self._handle(self._splitter.feed(text))

    def finish(self) -> list[ParsedPiece]:
        pieces = self._handle(self._splitter.finish())
        if self._state == "call":
            error = ParseError(f"the output ended inside an unclosed tool call: {self._call_body[:200]!r}")
            pieces.append(unreadable_call(CALL_OPEN + self._call_body, error))
        return pieces

    def _handle(self, events: list[str | Tag]) -> list[ParsedPiece]:
        pieces: list[ParsedPiece] = []
        for event in events:
            if isinstance(event, Tag):
                pieces += self._tag(event.text)
            else:
                pieces += self._text(event)
        return pieces

    def _tag(self, tag: str) -> list[ParsedPiece]:
        if self._state == "call":
            if tag != CALL_CLOSE:
                return self._text(tag)
            self._begin_run("content")
            try:
                return [ParsedPiece("tool_call", tool_call=self._call())]
            except ParseError as exc:
                return [unreadable_call(CALL_OPEN + self._call_body + CALL_CLOSE, exc)]
        if self._state == "start" and tag == THINK_OPEN and not self._run_started:
            self._begin_run("thinking")
        elif self._state == "thinking" and tag == THINK_CLOSE:
            self._begin_run("content")
        elif self._state != "thinking" and tag == CALL_OPEN:
            self._state, self._call_body = "call", ""
        else:
            return self._text(tag)
        return []

    def _call(self) -> ToolCall:
        call = self._read_call(self._call_body, self._tools)
        if self._tools and call.name not in self._tools:
            raise ParseError(f"the model called {call.name!r}, which is not among the tools offered")
        return call

    def _begin_run(self, state: str) -> None:
        self._state, self._run_started, self._held_space = state, False, ""

    def _text(self, text: str) -> list[ParsedPiece]:
        if self._state == "call":
            self._call_body += text
            return []
        if not self._run_started:
            text = text.lstrip()
            if not text:
                return []
            self._run_started = True
        if self._state == "start":
            self._state = "content"
        body = text.rstrip()
        if not body:
            self._held_space += text
            return []
        out = self._held_space + body
        self._held_space = text[len(body) :]
        return [ParsedPiece("thinking" if self._state == "thinking" else "content", out)]
