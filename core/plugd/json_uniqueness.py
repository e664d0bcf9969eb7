"""Keys that a JSON object never repeats, and strings and numbers that a uniqueItems array never repeats, kept
so token by token around a grammar engine's matcher.

Grammars (llguidance's, xgrammar's) keep a key of `properties` from repeating, but not one beyond them: a model
could write {"x": 1, "x": 2}, which a parser reads as one key, so that minProperties is not met and a value is
lost. And no grammar can say that the items of an array differ. `UniqueValues` follows the JSON written so far
and takes out of each mask the tokens that would close a key its object has already, or a string or number its
uniqueItems array has already.

A string closes at a quote. Most tokens that hold a quote hold one, with no backslash before it: inside a string,
such a token closes it with the text before its quote, so the tokens that would repeat a string are found by
looking that text up (`TokenIndex.closing`). A number closes at the first byte that cannot go on with it: the
tokens that begin with number characters and then hold another are looked up by those characters
(`TokenIndex.number_ends`). The other tokens that could close a string or a number (`TokenIndex.followed`,
`TokenIndex.numbers_followed`) are followed byte by byte.

Where the grammar leaves no way on but a repeat (a string it allows to end only as one it wrote before), the
mask would be empty: the matcher raises RepeatOnly instead, and the request ends with that error. Nothing
invalid is written.
"""

from __future__ import annotations

import copy
import json
from collections import deque
from typing import Any

import numpy as np

from plugd.constants import MAX_DRAFT_TOKENS
from plugd.json_schema import subschemas, transformed
from plugd.runner_api import GrammarDeadEnd, Matcher

ITEMS = "*"  # an array's items, in a path of keys
ROLLBACK_LIMIT = MAX_DRAFT_TOKENS  # the most recent tokens a UniqueValues can roll back: a round's drafts at most
_NUMBER = frozenset(b"0123456789+-.eE")  # the bytes a JSON number is written with
_NUMBER_START = frozenset(b"-0123456789")


class RepeatOnly(GrammarDeadEnd):
    """The grammar allows no token that does not repeat a key or a unique item."""


class TokenIndex:
    """A vocabulary's tokens that could close a string or a number, as `UniqueValues` looks them up."""

    def __init__(self, token_bytes: list[bytes]):
        self.token_bytes = token_bytes
        closing: dict[bytes, list[int]] = {}
        number_ends: dict[bytes, list[int]] = {}
        self.followed, self.numbers_followed = [], []
        for token, text in enumerate(token_bytes):
            if (quotes := text.count(b'"')) == 1 and b"\\" not in (before := text[: text.index(b'"')]):
                closing.setdefault(before, []).append(token)
            elif quotes:
                self.followed.append(token)
            lead = len(text) - len(text.lstrip(bytes(_NUMBER)))
            if lead < len(text):
                number_ends.setdefault(text[:lead], []).append(token)
                if any(_begins_and_ends_a_number(text, i) for i in range(lead + 1, len(text))):
                    self.numbers_followed.append(token)
        self.closing = {before: np.array(tokens) for before, tokens in closing.items()}
        self.all_closing = np.array([token for tokens in closing.values() for token in tokens], np.int64)
        self.number_ends = {lead: np.array(tokens) for lead, tokens in number_ends.items()}


def _begins_and_ends_a_number(text: bytes, i: int) -> bool:
    """Whether a number could begin at text[i] (after a byte that is not one's) and end within `text`."""
    return (text[i] in _NUMBER_START and text[i - 1] not in _NUMBER
            and any(byte not in _NUMBER for byte in text[i + 1 :]))


class _Container:
    """An object (its keys so far) or an array (its string and number items so far, where they must differ;
    numbers as floats, so that 1 and 1.0 are one)."""

    __slots__ = ("is_object", "path", "seen", "added", "expecting_key", "key")

    def __init__(self, is_object: bool, path: tuple[str, ...], seen: set[str | float] | None):
        self.is_object, self.path, self.seen = is_object, path, seen
        self.added: set[str | float] = set()  # what a trial run writes, beside `seen`
        self.expecting_key = is_object
        self.key: str | None = None

    def trial(self) -> _Container:
        copy = _Container(self.is_object, self.path, self.seen)
        copy.expecting_key, copy.key = self.expecting_key, self.key
        return copy

    def has(self, value: str | float) -> bool:
        return self.seen is not None and (value in self.seen or value in self.added)


class _Follower:
    """Where the JSON written so far stands: the open containers, and the string being written."""

    def __init__(self, unique_arrays: frozenset[tuple[str, ...]]):
        self.unique_arrays = unique_arrays
        self.stack: list[_Container] = []
        self.string: bytearray | None = None  # the raw bytes of the string being written
        self.escaped = False  # the last byte of `string` began an escape
        self.checked: _Container | None = None  # whose values the string being written must not repeat
        self.number: bytearray | None = None  # the item of a unique array being written, where it is a number

    def trial(self) -> _Follower:
        copy = _Follower(self.unique_arrays)
        copy.stack = [container.trial() for container in self.stack]
        copy.string = None if self.string is None else bytearray(self.string)
        copy.escaped = self.escaped
        copy.number = None if self.number is None else bytearray(self.number)
        copy.checked = copy.stack[self.stack.index(self.checked)] if self.checked is not None else None
        return copy

    def feed(self, data: bytes, trial: bool) -> bool:
        """Follow `data`; True where it closes a string or number that repeats (and, in a trial, stop there)."""
        for byte in data:
            if self.number is not None:
                if byte in _NUMBER:
                    self.number.append(byte)
                    continue
                number, self.number = self.number, None
                if self._item_closed(_number(number), trial) and trial:
                    return True
            if self.string is not None:
                if self.escaped:
                    self.escaped = False
                elif byte == 0x5C:  # backslash
                    self.escaped = True
                elif byte == 0x22:  # the closing quote
                    if self._closed(_decoded(self.string), trial) and trial:
                        return True
                    continue
                self.string.append(byte)
            elif byte == 0x22:
                self._open_string()
            elif byte in _NUMBER_START and self._in_unique_array():
                self.number = bytearray([byte])
            elif byte in b"{[":
                self.stack.append(self._container(byte == ord("{")))
            elif byte in b"}]":
                self.stack.pop()
            elif byte == ord(",") and self.stack and self.stack[-1].is_object:
                self.stack[-1].expecting_key = True
            elif byte == ord(":"):
                self.stack[-1].expecting_key = False
        return False

    def _in_unique_array(self) -> bool:
        return bool(self.stack) and not self.stack[-1].is_object and self.stack[-1].seen is not None

    def _item_closed(self, value: float | None, trial: bool) -> bool:
        """A number item of the unique array on top is written; True where it repeats one."""
        top = self.stack[-1]
        if value is None:
            return False
        repeats = top.has(value)
        (top.added if trial else top.seen).add(value)
        return repeats

    def _container(self, is_object: bool) -> _Container:
        path = self._value_path()
        unique = not is_object and path in self.unique_arrays
        return _Container(is_object, path, set() if is_object or unique else None)

    def _value_path(self) -> tuple[str, ...]:
        if not self.stack:
            return ()
        top = self.stack[-1]
        return (*top.path, top.key if top.is_object else ITEMS)

    def _open_string(self) -> None:
        self.string, self.escaped = bytearray(), False
        top = self.stack[-1] if self.stack else None
        is_key = top is not None and top.is_object and top.expecting_key
        self.checked = top if top is not None and (is_key or not top.is_object and top.seen is not None) else None

    def _closed(self, value: str | None, trial: bool) -> bool:
        """Close the string being written; True where it repeats what it must not."""
        checked, self.string, self.checked = self.checked, None, None
        top = self.stack[-1] if self.stack else None
        if top is not None and top.is_object and top.expecting_key:
            top.key = value
        if checked is None or value is None:
            return False
        repeats = checked.has(value)
        (checked.added if trial else checked.seen).add(value)
        return repeats

    def repeating(self, index: TokenIndex, allowed: np.ndarray) -> list[np.ndarray | list[int]]:
        """The tokens that would close a string repeating what it must not, among others (`allowed`: the bits
        of the tokens the grammar allows, which are the only ones followed)."""
        found: list[np.ndarray | list[int]] = []

        def followed(tokens: list[int]) -> list[int]:
            return [t for t in tokens if allowed[t] and self.trial().feed(index.token_bytes[t], True)]

        if self.checked is not None and self.checked.seen:
            if self.escaped or b"\\" in self.string:  # the text so far is not the value so far: follow each
                found.append(followed(index.all_closing.tolist()))
            else:
                written = bytes(self.string)
                for value in self.checked.seen:
                    encoded = value.encode("utf-8", "surrogatepass")  # a lone surrogate is only written escaped
                    if encoded.startswith(written) and (tokens := index.closing.get(encoded[len(written):])) is not None:
                        found.append(tokens)
        if self._in_unique_array() and self.string is None:  # a token may write two equal items itself
            written, seen = bytes(self.number or b""), self.stack[-1].seen
            for lead, tokens in index.number_ends.items():
                if (number := written + lead) and number[0] in _NUMBER_START and _number(number) in seen:
                    found.append(tokens)
            found.append(followed(index.numbers_followed))
        if any(container.seen is not None for container in self.stack):
            found.append(followed(index.followed))
        return found


def _number(raw: bytes | bytearray) -> float | None:
    """The value of a JSON number's bytes; None where they are not one."""
    try:
        value = json.loads(bytes(raw))
    except ValueError:
        return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _decoded(raw: bytearray) -> str | None:
    """The value of a JSON string's raw bytes; None where they are not one (a trial through a token the grammar
    would not allow)."""
    try:
        return json.loads(b'"' + bytes(raw) + b'"')
    except ValueError:
        return None


class UniqueValues:
    """A Matcher that never lets a key repeat in its object, nor a string or number item in an array at
    `unique_arrays` (paths of keys and ITEMS from the root)."""

    def __init__(self, inner: Matcher, index: TokenIndex, unique_arrays: frozenset[tuple[str, ...]]):
        self._inner, self._index = inner, index
        self._follower = _Follower(unique_arrays)
        self._before: deque[_Follower] = deque(maxlen=ROLLBACK_LIMIT)  # the follower before each recent token

    def fill_mask(self, bitmask: np.ndarray) -> None:
        self._inner.fill_mask(bitmask)
        if not any(container.seen is not None for container in self._follower.stack):
            return  # no object, nor unique array, is open: nothing here can repeat
        allowed = np.unpackbits(bitmask.view(np.uint8), bitorder="little")
        tokens = [np.asarray(found, np.int64) for found in self._follower.repeating(self._index, allowed) if len(found)]
        if not tokens:
            return
        banned = np.concatenate(tokens)
        words = bitmask.view(np.uint32)
        np.bitwise_and.at(words, banned // 32, ~(np.uint32(1) << (banned % 32).astype(np.uint32)))
        if not words.any():
            raise RepeatOnly("the schema allows nothing more here but a key or a unique item written already")

    def accept(self, token: int) -> bool:
        if not self._inner.accept(token):
            return False
        self._before.append(copy.deepcopy(self._follower))
        self._follower.feed(self._index.token_bytes[token], trial=False)
        return True

    @property
    def rolls_back(self) -> bool:
        return hasattr(self._inner, "rollback")

    def rollback(self, count: int) -> None:
        """Forget the last `count` tokens (at most ROLLBACK_LIMIT); only where the inner matcher can (`rolls_back`)."""
        if count > len(self._before):
            raise ValueError(f"cannot roll back {count} tokens, only {len(self._before)}")
        if count:
            self._inner.rollback(count)
            for _ in range(count - 1):
                self._before.pop()
            self._follower = self._before.pop()


def unique_arrays(schema: Any) -> frozenset[tuple[str, ...]] | None:
    """The paths (keys and ITEMS) of the arrays whose `uniqueItems` UniqueValues keeps: arrays of strings or of
    numbers that the schema declares inline, under `properties` and `items` only, so that the path names them
    wherever they are; None where an array with uniqueItems is not one of them (its uniqueItems is left to the
    engine)."""
    if not isinstance(schema, dict):
        return frozenset()
    declared = [node for _, node in subschemas(schema) if node.get("uniqueItems") is True]
    if not declared:
        return frozenset()
    if any(str(node.get("$ref")).startswith(("#/properties", "#/items")) or node.get("$ref") == "#"
           for _, node in subschemas(schema)):
        return None  # the inline schema is entered at other paths too
    found, stack = [], [(schema, ())]
    while stack:
        node, path = stack.pop()
        if node.get("uniqueItems") is True:
            if "prefixItems" in node or not _extendable(node.get("items")):
                return None
            found.append(path)
        stack += [(child, (*path, key)) for key, child in (node.get("properties") or {}).items()
                  if isinstance(child, dict)]
        if isinstance(node.get("items"), dict) and "prefixItems" not in node:
            stack.append((node["items"], (*path, ITEMS)))
    return frozenset(found) if len(found) == len(declared) else None


def without_unique_items(schema: Any) -> Any:
    """`schema` without its uniqueItems, for an engine whose matcher UniqueValues wraps."""
    return transformed(schema, lambda node: {key: value for key, value in node.items() if key != "uniqueItems"})


def _extendable(items: Any) -> bool:
    """Whether `items` are strings or numbers that can always be written on, so that a repeat can be avoided by
    writing more: no listed values, no format, no pattern that ends a string short, no greatest number."""
    if not isinstance(items, dict) or items.keys() & {"enum", "const", "format", "multipleOf"}:
        return False
    if items.get("type") in ("integer", "number"):
        return not items.keys() & {"maximum", "exclusiveMaximum"}
    pattern = items.get("pattern")
    return items.get("type") == "string" and (
        pattern is None or isinstance(pattern, str) and (not pattern.endswith("$") or pattern.endswith(("+$", "*$"))))
