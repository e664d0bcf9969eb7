"""Gemma 4's output, parsed as it streams: a thought channel, answer text, and native tool calls.

The model writes `<|channel>thought\\n...<channel|>` for its thinking and
`<|tool_call>call:NAME{...}<tool_call|>` for each call (see gemma4_syntax), and
ends its turn with `<turn|>`, or with `<|tool_response>` when it waits for the
results of its calls; anything after either is not part of its answer.
Text runs are trimmed at tag boundaries, as the template trims them when it
writes them back into history. A `<tool_call|>` outside a call (the model
sometimes repeats it) and a `<channel|>` outside a channel are dropped. A call
that cannot be read is passed on as the text the model wrote
(plugd.parsing.unreadable_call).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from plugd.hookspecs import ParsedPiece
from plugd.parsing import ParseError, Tag, TagSplitter, unreadable_call
from plugd.types import Tool
from plugd_render_gemma.gemma4_syntax import QUOTE, read_call

OPEN_CHANNEL, CLOSE_CHANNEL = "<|channel>", "<channel|>"
OPEN_CALL, CLOSE_CALL = "<|tool_call>", "<tool_call|>"
END_OF_ANSWER = ("<turn|>", "<|tool_response>")
CHANNEL_NAME = "thought\n"

State = Literal["content", "thinking", "call", "done"]
_ENDINGS: dict[str, State] = dict.fromkeys(END_OF_ANSWER, "done")
_TRANSITIONS: dict[State, dict[str, State]] = {
    "content": {OPEN_CHANNEL: "thinking", OPEN_CALL: "call", **_ENDINGS},
    "thinking": {CLOSE_CHANNEL: "content", OPEN_CALL: "call", **_ENDINGS},
}


class Gemma4Parser:
    """One response's parser; the prompt tells whether the output starts inside an open thought channel."""

    def __init__(self, prompt: str):
        self._splitter = TagSplitter([OPEN_CHANNEL, CLOSE_CHANNEL, OPEN_CALL, CLOSE_CALL, QUOTE, *END_OF_ANSWER])
        self._state: State = "content"
        self._run_start = True  # leading whitespace of a text run is dropped
        self._trailing = ""  # whitespace held back until more text of the same run follows
        self._channel_name: str | None = None  # what has come of the channel name, while it is still expected
        self._call: list[str] = []
        self._in_string = False
        if prompt.endswith(OPEN_CHANNEL + CHANNEL_NAME):
            self._state = "thinking"
        elif prompt.endswith(OPEN_CHANNEL):
            self._enter("thinking")

    def feed(self, text: str) -> list[ParsedPiece]:
        return self._events(self._splitter.feed(text))

    def finish(self) -> list[ParsedPiece]:
        pieces = self._events(self._splitter.finish())
        if self._state == "call":
            pieces += self._end_call("done", closing="")
        return pieces

    def _events(self, events: list[str | Tag]) -> list[ParsedPiece]:
        pieces: list[ParsedPiece] = []
        for event in events:
            if isinstance(event, Tag):
                pieces += self._tag(event.text)
            elif self._state == "call":
                self._call.append(event)
            elif self._state != "done":
                pieces += self._text(event)
        return pieces

    def _tag(self, tag: str) -> list[ParsedPiece]:
        if self._state == "call":
            return self._call_tag(tag)
        if self._state == "done":
            return []
        if tag == QUOTE:
            return self._text(tag)  # outside a call the quote token is just what the model wrote
        after = _TRANSITIONS[self._state].get(tag)
        if after is not None:  # any other tag is a stray closer, dropped
            self._enter(after)
        return []

    def _call_tag(self, tag: str) -> list[ParsedPiece]:
        if tag == QUOTE:
            self._in_string = not self._in_string
        if tag == QUOTE or self._in_string:
            self._call.append(tag)  # inside a string every tag is text
            return []
        if tag == CLOSE_CALL:
            return self._end_call("content", closing=tag)
        if tag in END_OF_ANSWER:
            return self._end_call("done", closing="")
        written = OPEN_CALL + "".join(self._call) + tag
        self._enter("content")
        return [unreadable_call(written, ParseError(f"{tag} inside a Gemma 4 tool call: {written!r}"))]

    def _end_call(self, after: State, closing: str) -> list[ParsedPiece]:
        """The call read from what came since its opening tag; the text as written if it cannot be read."""
        body, in_string = "".join(self._call), self._in_string
        self._enter(after)
        try:
            if in_string:
                raise ParseError(f"the call ended inside a string: {body!r}")
            return [ParsedPiece("tool_call", tool_call=read_call(body))]
        except ParseError as exc:
            return [unreadable_call(OPEN_CALL + body + closing, exc)]

    def _enter(self, state: State) -> None:
        self._state = state
        self._run_start, self._trailing = True, ""
        self._channel_name = "" if state == "thinking" else None
        self._call, self._in_string = [], False

    def _text(self, text: str) -> list[ParsedPiece]:
        if self._channel_name is not None:
            text = self._past_channel_name(text)
        if self._run_start:
            text = text.lstrip()
            self._run_start = not text
        run = self._trailing + text
        kept = run.rstrip()
        self._trailing = run[len(kept) :]
        return [ParsedPiece(self._state, kept)] if kept else []

    def _past_channel_name(self, text: str) -> str:
        """The text after the channel name `thought\\n`; empty while the name may still be arriving."""
        seen = self._channel_name + text
        if seen.startswith(CHANNEL_NAME):
            self._channel_name = None
            return seen[len(CHANNEL_NAME) :]
        if CHANNEL_NAME.startswith(seen):
            self._channel_name = seen
            return ""
        self._channel_name = None  # no channel name: it was all thinking
        return seen


def create(tools: Sequence[Tool], prompt: str) -> Gemma4Parser:
    return Gemma4Parser(prompt)
