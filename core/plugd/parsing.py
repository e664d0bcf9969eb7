"""Building blocks for streaming output parsers: a tag splitter that never emits half a tag, and argument typing.

A family's parser is a small state machine over the events a TagSplitter
yields (text runs and whole tags); it never has to think about a tag arriving
split across two decoded pieces.

A tool call the model writes badly (unclosed, arguments that are not JSON, a
tool not offered) is passed on as the text the model wrote, as content, with a
warning in the log (`unreadable_call`): the agent shows it and the
conversation goes on. Failing the response instead would have agents resend
the same request (Codex retries a failed response five times), and a greedy
model writes the same call again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from attrs import define

from plugd.hookspecs import ParsedPiece

log = logging.getLogger(__name__)


class ParseError(ValueError):
    """The model's output does not follow its family's format (an unclosed call, arguments that are not JSON...)."""


def unreadable_call(written: str, error: ParseError) -> ParsedPiece:
    """A tool call that could not be read, as content: exactly the text the model wrote, tags included."""
    log.warning("a tool call the model wrote could not be read (%s); it is passed on as content", error)
    return ParsedPiece("content", written)


@define(frozen=True)
class Tag:
    """One of the splitter's tags, seen whole in the stream."""

    text: str


class TagSplitter:
    """Splits streamed text into text runs and Tag events, holding back any suffix that could begin a tag."""

    def __init__(self, tags: Iterable[str]):
        self._tags = sorted(set(tags), key=len, reverse=True)
        if not self._tags or not all(self._tags):
            raise ValueError("a TagSplitter needs at least one non-empty tag")
        self._held = ""

    def feed(self, text: str) -> list[str | Tag]:
        self._held += text
        events: list[str | Tag] = []
        while self._held:
            start, tag = self._first_tag()
            if tag is None:
                keep = self._partial_tag_length()
                if len(self._held) > keep:
                    events.append(self._held[: len(self._held) - keep])
                    self._held = self._held[len(self._held) - keep :]
                break
            if start:
                events.append(self._held[:start])
            events.append(Tag(tag))
            self._held = self._held[start + len(tag) :]
        return events

    def finish(self) -> list[str | Tag]:
        """What is still held back, as plain text: the stream ended before it could become a tag."""
        held, self._held = self._held, ""
        return [held] if held else []

    def _first_tag(self) -> tuple[int, str | None]:
        best: tuple[int, str | None] = (len(self._held), None)
        for tag in self._tags:  # longest first, so a tag that begins another wins at the same position
            at = self._held.find(tag, 0, best[0] + len(tag))
            if at != -1 and at < best[0]:
                best = (at, tag)
        return best

    def _partial_tag_length(self) -> int:
        """The length of the longest suffix of the held text that is a proper prefix of some tag."""
        longest = 0
        for tag in self._tags:
            for size in range(min(len(tag) - 1, len(self._held)), longest, -1):
                if self._held.endswith(tag[:size]):
                    longest = size
                    break
        return longest


def parse_json_arguments(text: str, tool_name: str) -> dict[str, Any]:
    """A tool call's JSON arguments, which must be an object."""
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ParseError(f"the arguments of the call to {tool_name!r} are not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ParseError(f"the arguments of the call to {tool_name!r} are not a JSON object")
    return value


def typed_argument(value: str, schema: Mapping[str, Any] | None) -> Any:
    """A parameter written as bare text (XML-style calls), converted to the type its JSON schema declares.

    Strings stay as written; other types are read as JSON, falling back to the
    text itself when it does not parse, so that a loosely written value is
    passed on rather than lost.
    """
    types = (schema or {}).get("type", "string")
    types = [types] if isinstance(types, str) else list(types)
    if types == ["string"]:
        return value
    stripped = value.strip()
    if "integer" in types or "number" in types:
        try:
            number = float(stripped)
        except ValueError:
            pass
        else:
            if "integer" in types and number.is_integer() and "." not in stripped and "e" not in stripped.lower():
                return int(stripped)
            if "number" in types:
                return int(stripped) if stripped.lstrip("-").isdigit() else number
    if "boolean" in types and stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    if "null" in types and stripped.lower() in ("null", "none"):
        return None
    if {"object", "array"} & set(types):
        try:
            return json.loads(stripped)
        except json.JSONDecodeError:
            pass
    return value
