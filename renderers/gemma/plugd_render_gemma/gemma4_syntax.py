"""Gemma 4's value syntax, both ways: JSON values as the template writes them, and tool calls as the model writes them.

Strings are wrapped in the special quote token `<|"|>` (never escaped:
whatever lies between two quote tokens is the string), keys of call arguments
are bare, objects are written with their keys sorted case-insensitively (as
Jinja's `dictsort` does) and everything else (numbers, true, false, null)
is bare: `call:get_weather{city:<|"|>Paris<|"|>,days:3}`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from plugd.parsing import ParseError
from plugd.types import ToolCall

QUOTE = '<|"|>'


def dictsorted(mapping: Mapping[Any, Any]) -> list[tuple[Any, Any]]:
    """The items in the order of Jinja's `dictsort`: by key, ignoring case, ties in insertion order."""
    return sorted(mapping.items(), key=lambda item: item[0].lower() if isinstance(item[0], str) else item[0])


def write_value(value: Any, *, quote_keys: bool = True, null: str = "null") -> str:
    """A value as the template's `format_argument` writes it; `null` is how this revision writes None."""
    if value is None:
        return null
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        pairs = (
            (QUOTE + str(key) + QUOTE if quote_keys else str(key)) + ":" + write_value(item, quote_keys=quote_keys, null=null)
            for key, item in dictsorted(value)
        )
        return "{" + ",".join(pairs) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(write_value(item, quote_keys=quote_keys, null=null) for item in value) + "]"
    return str(value)


def write_arguments(arguments: Mapping[str, Any], *, null: str = "null") -> str:
    """The body of a call or a tool response: `key:value` pairs, keys bare, without the surrounding braces."""
    return ",".join(f"{key}:{write_value(value, quote_keys=False, null=null)}" for key, value in dictsorted(arguments))


_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None, "None": None}


def read_call(text: str) -> ToolCall:
    """A call as the model writes it between `<|tool_call>` and `<tool_call|>`: `call:NAME{key:value,...}`."""
    reader = _Reader(text)
    reader.skip_space()
    reader.expect("call:")
    brace = text.find("{", reader.at)
    name = text[reader.at : brace].strip() if brace != -1 else ""
    if not name or reader.quote_between(reader.at, brace):
        raise ParseError(f"a Gemma 4 tool call must read call:NAME{{...}}, got {text!r}")
    reader.at = brace
    arguments = reader.value()
    reader.skip_space()
    if reader.at != len(text):
        raise ParseError(f"unexpected text after the arguments of the call to {name!r}: {text[reader.at :]!r}")
    return ToolCall(name=name, arguments=arguments)


class _Reader:
    """A recursive-descent reader over one call's text; `at` is the position of the next character to read."""

    def __init__(self, text: str):
        self.text = text
        self.at = 0

    def fail(self, what: str) -> ParseError:
        return ParseError(f"{what} at offset {self.at} of the Gemma 4 tool call {self.text!r}")

    def skip_space(self) -> None:
        while self.at < len(self.text) and self.text[self.at].isspace():
            self.at += 1

    def expect(self, token: str) -> None:
        if not self.text.startswith(token, self.at):
            raise self.fail(f"expected {token!r}")
        self.at += len(token)

    def quote_between(self, start: int, end: int) -> bool:
        return self.text.find(QUOTE, start, end) != -1

    def value(self) -> Any:
        self.skip_space()
        if self.text.startswith(QUOTE, self.at):
            return self.string()
        if self.text.startswith("{", self.at):
            return self.object()
        if self.text.startswith("[", self.at):
            return self.array()
        return self.bare()

    def string(self) -> str:
        self.at += len(QUOTE)
        end = self.text.find(QUOTE, self.at)
        if end == -1:
            raise self.fail("unterminated string")
        value, self.at = self.text[self.at : end], end + len(QUOTE)
        return value

    def object(self) -> dict[str, Any]:
        self.at += 1
        result: dict[str, Any] = {}
        for _ in self.items("}"):
            key = self.key()
            self.expect(":")
            result[key] = self.value()
        return result

    def array(self) -> list[Any]:
        self.at += 1
        return [self.value() for _ in self.items("]")]

    def items(self, close: str):
        """Yields once per item of a comma-separated list up to `close`, which it consumes."""
        self.skip_space()
        if self.text.startswith(close, self.at):
            self.at += 1
            return
        while True:
            yield
            self.skip_space()
            if self.text.startswith(",", self.at):
                self.at += 1
            elif self.text.startswith(close, self.at):
                self.at += 1
                return
            else:
                raise self.fail(f"expected ',' or {close!r}")

    def key(self) -> str:
        self.skip_space()
        if self.text.startswith(QUOTE, self.at):
            return self.string()
        end = self.text.find(":", self.at)
        key = self.text[self.at : end].strip() if end != -1 else ""
        if not key or any(c in key for c in "{}[],") or self.quote_between(self.at, end):
            raise self.fail("expected a key")
        self.at = end
        return key

    def bare(self) -> Any:
        """A number, true, false or null; other bare text is taken as the string the model meant."""
        start = self.at
        while self.at < len(self.text) and self.text[self.at] not in ",}]" and not self.text.startswith(QUOTE, self.at):
            self.at += 1
        word = self.text[start : self.at].strip()
        if not word:
            raise self.fail("expected a value")
        if word in _LITERALS:
            return _LITERALS[word]
        if _NUMBER.fullmatch(word):
            return json.loads(word)
        return word
