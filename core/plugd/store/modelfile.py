"""Ollama-style Modelfiles: one instruction per command (FROM, DRAFT, PARAMETER, SYSTEM, TEMPLATE, RENDERER,
PARSER, MESSAGE, LICENSE), each with a bare, double-quoted or triple-quoted (multi-line) argument."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import attrs

from plugd.types import OPTION_TYPES

ROLES = ("system", "user", "assistant")
_COMMANDS = ("from", "draft", "parameter", "system", "template", "renderer", "parser", "message", "license")
_KEYED = {"parameter": "PARAMETER needs a name and a value", "message": "MESSAGE needs a role and content"}
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')  # one line; a backslash escapes the next character
_ESCAPE = re.compile(r'\\(["\\])')  # only \" and \\ are unescaped; other backslashes stay as written


class ModelfileError(ValueError):
    """A mistake in a Modelfile; the message is always `<filename>:<line>: <what is wrong>`."""


@attrs.define
class Modelfile:
    from_: str
    draft: str | None = None  # a draft model for speculative decoding: a model's name or a directory, as FROM takes
    parameters: dict[str, Any] = attrs.Factory(dict)
    system: str | None = None
    template: str | None = None
    renderer: str | None = None
    parser: str | None = None
    messages: list[dict[str, str]] = attrs.Factory(list)
    license: list[str] = attrs.Factory(list)


def parameter_value(name: str, text: str) -> tuple[str, Any]:
    """A PARAMETER's name, lowercased, and `text` read as the option's type (a list option's one item stays text);
    raises ValueError saying what is wrong. `plugd run`'s /set parameter reads its values with this too."""
    kind = OPTION_TYPES.get(name.lower())
    if kind is None:
        raise ValueError(f"unknown parameter {name!r}")
    if kind is list:
        return name.lower(), text
    try:
        return name.lower(), kind(text)
    except ValueError:
        raise ValueError(f"invalid value {text!r} for parameter {name.lower()}: expected {kind.__name__}") from None


def _error(filename: str, line: int, what: str) -> ModelfileError:
    return ModelfileError(f"{filename}:{line}: {what}")


def _argument(rest: str, lines: list[str], i: int, filename: str) -> tuple[str, int]:
    """The argument that starts `rest` (the remainder of lines[i]) and the index of the line after it."""
    if rest.startswith('"""'):
        body, end = rest[3:], i
        while '"""' not in body:
            end += 1
            if end == len(lines):
                raise _error(filename, i + 1, 'unterminated """ quote')
            body += "\n" + lines[end]
        value, _, after = body.partition('"""')
    elif rest.startswith('"'):
        match = _QUOTED.match(rest)
        if not match:
            raise _error(filename, i + 1, 'unterminated " quote')
        value, after, end = _ESCAPE.sub(r"\1", match[1]), rest[match.end() :], i
    else:
        return rest.strip(), i + 1
    if after.strip():
        raise _error(filename, end + 1, f"unexpected text after closing quote: {after.strip()!r}")
    return value, end + 1


def _instructions(lines: list[str], filename: str) -> Iterator[tuple[int, str, str | None, str]]:
    """Each instruction as (line number, lowercased command, PARAMETER name or MESSAGE role, argument)."""
    i = 0
    while i < len(lines):
        words = lines[i].split(None, 1)
        if not words or words[0].startswith("#"):
            i += 1
            continue
        line, command = i + 1, words[0].lower()
        if command not in _COMMANDS:
            raise _error(filename, line, f"unknown command {words[0]!r}")
        rest, key = words[1] if len(words) == 2 else "", None
        if command in _KEYED:
            parts = rest.split(None, 1)
            if len(parts) < 2:
                raise _error(filename, line, _KEYED[command])
            key, rest = parts
        elif not rest:
            raise _error(filename, line, f"{command.upper()} needs an argument")
        value, i = _argument(rest, lines, i, filename)
        yield line, command, key, value


def parse_modelfile(text: str, filename: str = "Modelfile") -> Modelfile:
    """Read a Modelfile, raising ModelfileError at the first mistake."""
    modelfile = Modelfile(from_="")
    from_line = draft_line = None
    for line, command, key, value in _instructions(text.replace("\r\n", "\n").split("\n"), filename):
        if command == "from":
            if from_line is not None:
                raise _error(filename, line, f"second FROM line (the first is line {from_line})")
            modelfile.from_, from_line = value, line
        elif command == "draft":
            if draft_line is not None:
                raise _error(filename, line, f"second DRAFT line (the first is line {draft_line})")
            modelfile.draft, draft_line = value, line
        elif command == "parameter":
            try:
                name, typed = parameter_value(key, value)
            except ValueError as exc:
                raise _error(filename, line, str(exc)) from None
            if OPTION_TYPES[name] is list:
                modelfile.parameters.setdefault(name, []).append(typed)
            else:
                modelfile.parameters[name] = typed
        elif command == "message":
            if key.lower() not in ROLES:
                raise _error(filename, line, f"invalid role {key!r}: expected one of {', '.join(ROLES)}")
            modelfile.messages.append({"role": key.lower(), "content": value})
        elif command == "license":
            modelfile.license.append(value)
        else:  # system, template, renderer, parser: a later one replaces an earlier one
            setattr(modelfile, command, value)
    if from_line is None:
        raise _error(filename, 1, "no FROM line")
    return modelfile

