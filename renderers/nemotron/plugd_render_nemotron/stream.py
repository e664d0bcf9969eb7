"""A streaming parser for output made of `<think>` reasoning, answer text and delimited tool-call blocks.

Both Nemotron families write the same outline and differ only in how a call
block is delimited and what is inside it, so a family's parser is this one
given its call tags and a decoder for the block's body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from plugd.hookspecs import ParsedPiece
from plugd.parsing import ParseError, Tag, TagSplitter, unreadable_call
from plugd.types import ToolCall

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

CallDecoder = Callable[[str], list[ToolCall]]


def prompt_opens_thinking(prompt: str) -> bool:
    """Whether the prompt ends inside a thinking block it opened (a generation prompt ending in `<think>\\n`)."""
    return prompt.rfind(THINK_OPEN) > prompt.rfind(THINK_CLOSE)


class ThinkingAndCallsParser:
    """Splits output into thinking, content and tool calls, whatever way the text is cut into pieces.

    Whitespace next to a tag (which the templates write around every tag) is
    dropped: a segment's leading whitespace at once, its trailing whitespace
    held back until more text shows it was inside the segment. `<think>`
    opens thinking only where a segment has not begun yet; a tag out of place
    is passed on as text. Call tags are recognised only when tools were
    offered (`decode` given); a call block that is unclosed or cannot be decoded is passed on as the text the
    model wrote (plugd.parsing.unreadable_call).
    """

    def __init__(self, prompt: str, call_open: str, call_close: str, decode: CallDecoder | None):
        tags = [THINK_OPEN, THINK_CLOSE] + ([call_open, call_close] if decode else [])
        self._splitter = TagSplitter(tags)
        self._call_open, self._call_close, self._decode = call_open, call_close, decode
        self._state: Literal["thinking", "content", "call"] = "thinking" if prompt_opens_thinking(prompt) else "content"
        self._segment_started = False
        self._held_whitespace = ""
        self._call_body: list[str] = []

    def feed(self, text: str) -> list[ParsedPiece]:
        return self._handle(self._splitter.feed(text))

    def finish(self) -> list[ParsedPiece]:
        pieces = self._handle(self._splitter.finish())
        if self._state == "call":
            error = ParseError(f"the output ended inside an unclosed {self._call_open} block")
            pieces.append(unreadable_call(self._call_open + "".join(self._call_body), error))
        return pieces

    def _handle(self, events: list[str | Tag]) -> list[ParsedPiece]:
        pieces: list[ParsedPiece] = []
        for event in events:
            if self._state == "call":
                self._in_call(event, pieces)
            elif isinstance(event, Tag):
                self._tag(event.text, pieces)
            else:
                self._text(event, pieces)
        return pieces

    def _in_call(self, event: str | Tag, pieces: list[ParsedPiece]) -> None:
        if event != Tag(self._call_close):
            self._call_body.append(event.text if isinstance(event, Tag) else event)
            return
        body, self._call_body = "".join(self._call_body), []
        self._begin("content")
        try:
            pieces += [ParsedPiece("tool_call", tool_call=call) for call in self._decode(body)]
        except ParseError as exc:
            pieces.append(unreadable_call(self._call_open + body + self._call_close, exc))

    def _tag(self, tag: str, pieces: list[ParsedPiece]) -> None:
        if tag == THINK_OPEN and not self._segment_started:
            self._begin("thinking")
        elif tag == THINK_CLOSE and self._state == "thinking":
            self._begin("content")
        elif tag == self._call_open and self._state == "content":
            self._begin("call")
        else:
            self._text(tag, pieces)

    def _begin(self, state: Literal["thinking", "content", "call"]) -> None:
        self._state, self._segment_started, self._held_whitespace = state, False, ""

    def _text(self, text: str, pieces: list[ParsedPiece]) -> None:
        if not self._segment_started:
            text = text.lstrip()
            if not text:
                return
            self._segment_started = True
        text = self._held_whitespace + text
        kept = text.rstrip()
        self._held_whitespace = text[len(kept):]
        if kept:
            pieces.append(ParsedPiece(self._state, kept))
