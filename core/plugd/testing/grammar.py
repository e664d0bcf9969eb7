"""Probes for grammar engine plugins: does an engine enforce each JSON Schema keyword it accepts?

Each probe walks a byte-per-token vocabulary (`BYTES`) through an instance that breaks one keyword: where the
grammar still lets it through, the engine does not enforce that keyword, and must refuse schemas using it.
`GrammarEngineChecks` runs them all on an engine, as a pytest class a plugin's tests subclass.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from plugd.json_uniqueness import RepeatOnly
from plugd.runner_api import Compiler, GrammarRefused, GrammarVocabulary
from plugd.testing.random_schemas import random_schema, valid

STOP = 256
BYTES = GrammarVocabulary([bytes([b]) for b in range(256)] + [b""], frozenset({STOP}))
P = {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "string"}}
RANDOM_SCHEMAS = 1000


def allowed_tokens(matcher, width: int = BYTES.width) -> list[int]:
    """The tokens `matcher` allows next, of a vocabulary of `width`."""
    bitmask = np.zeros((width + 31) // 32, np.int32)
    matcher.fill_mask(bitmask)
    return np.flatnonzero(np.unpackbits(bitmask.view(np.uint8), count=width, bitorder="little")).tolist()


def accepts(engine: Compiler, schema: dict, instance) -> bool:
    """Whether the grammar lets a model write json.dumps(instance) and stop."""
    matcher = engine.compile("json_schema", schema).matcher()
    bitmask = np.zeros(9, np.int32)
    for token in [*json.dumps(instance).encode(), STOP]:
        matcher.fill_mask(bitmask)
        if not (bitmask[token // 32] >> (token % 32)) & 1 or not matcher.accept(token):
            return False
    return True


ENFORCED = [  # (keyword, schema, an instance it rules out)
    ("pattern", {"type": "string", "pattern": "^a+$"}, "b"),
    ("minLength", {"type": "string", "minLength": 3}, "a"),
    ("maxLength", {"type": "string", "maxLength": 2}, "abc"),
    ("format email", {"type": "string", "format": "email"}, "x"),
    ("format date-time", {"type": "string", "format": "date-time"}, "x"),
    ("format in a type list", {"type": ["string", "null"], "format": "ipv4"}, "x"),
    ("format date: month lengths", {"type": "string", "format": "date"}, "2023-04-31"),
    ("format date: leap years", {"type": "string", "format": "date"}, "2023-02-29"),
    ("format date: year 0", {"type": "string", "format": "date"}, "0000-08-08"),
    ("format date-time", {"type": "string", "format": "date-time"}, "2100-02-29T00:00:00Z"),
    ("format time: no second 60", {"type": "string", "format": "time"}, "12:00:60Z"),
    ("format regex", {"type": "string", "format": "regex"}, "(a"),
    ("minimum", {"type": "integer", "minimum": 5}, 1),
    ("exclusiveMaximum", {"type": "number", "exclusiveMaximum": 1}, 1),
    ("multipleOf on integers", {"type": "integer", "multipleOf": 3}, 4),
    ("minItems", {"type": "array", "minItems": 2}, [1]),
    ("maxItems", {"type": "array", "maxItems": 1}, [1, 2]),
    ("prefixItems", {"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, [1, 2]),
    ("oneOf of disjoint types", {"oneOf": [{"type": "integer"}, {"type": "string"}]}, 1.5),
    ("anyOf", {"anyOf": [{"type": "string"}, {"type": "null"}]}, 1),
    ("required", {"type": "object", "properties": P, "required": ["a"]}, {}),
    ("properties", {"type": "object", "properties": P}, {"b": "s"}),
    ("additionalProperties false", {"type": "object", "properties": P, "additionalProperties": False}, {"z": 1}),
    ("additionalProperties schema", {"type": "object", "additionalProperties": {"type": "integer"}}, {"a": "x"}),
    ("patternProperties", {"type": "object", "patternProperties": {"^x": {"type": "integer"}}}, {"xa": "s"}),
    ("propertyNames alone", {"type": "object", "propertyNames": {"pattern": "^x"}}, {"y": 1}),
    ("minProperties", {"type": "object", "minProperties": 1}, {}),
    ("maxProperties", {"type": "object", "maxProperties": 1}, {"a": 1, "b": 2}),
    ("enum", {"enum": ["x", 1]}, 2),
    ("const", {"const": {"a": [1, 2]}}, {"a": [1, 3]}),
    ("recursive $ref", {"$ref": "#/$defs/n", "$defs": {"n": {"type": "object", "additionalProperties": False,
                                                           "properties": {"c": {"$ref": "#/$defs/n"}}}}},
     {"c": {"d": {}}}),
]
# Dates and times the exact formats must let through (plugd.json_schema.with_format_patterns).
REAL_DATES = [("date", "2024-02-29"), ("date", "2000-02-29"), ("date", "0004-12-31"),
              ("date-time", "1999-12-31T23:59:59.999+05:30"), ("time", "00:00:00Z")]


class GrammarEngineChecks:
    """The checks every JSON Schema engine passes. A plugin's test module subclasses it (`class TestMine(
    GrammarEngineChecks)`) and sets `factory`, the engine's factory (called with `BYTES`); `refused_probes` names
    the ENFORCED probes the engine refuses instead of enforcing."""

    factory: Callable[[GrammarVocabulary], Compiler]
    refused_probes: frozenset[str] = frozenset()

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls) -> Compiler:
        return cls.factory(BYTES)

    @pytest.mark.parametrize(("keyword", "schema", "breaking"), ENFORCED, ids=[case[0] for case in ENFORCED])
    def test_each_keyword_is_enforced_or_refused(self, engine, keyword, schema, breaking):
        if keyword in self.refused_probes:
            with pytest.raises(GrammarRefused):
                engine.compile("json_schema", schema)
        else:
            assert not accepts(engine, schema, breaking)

    @pytest.mark.parametrize(("fmt", "value"), REAL_DATES)
    def test_real_dates_and_times_get_through(self, engine, fmt, value):
        assert accepts(engine, {"type": "string", "format": fmt}, value)

    def test_annotations_and_unknown_formats_pass(self, engine):
        schema = {"type": "object", "title": "t", "description": "d", "examples": [{"not": 1}], "default": {"not": 2},
                  "properties": {"n": {"type": "string", "format": "int32", "x-custom": True, "enum": ["not", "if"]}}}
        engine.compile("json_schema", schema)
        assert accepts(engine, {"type": "string", "format": "html-selector"}, "div > p")

    def test_random_schemas_are_enforced_or_refused(self, engine):
        """Random schemas (plugd.testing.random_schemas), each walked at random through what the grammar allows:
        every output that ends is valid JSON, writes no key twice, and meets its schema."""
        rng, written = random.Random(0), 0
        for _ in range(RANDOM_SCHEMAS):
            schema = random_schema(rng)
            try:
                compiled = engine.compile("json_schema", schema)
            except GrammarRefused:
                continue
            for _ in range(3):
                try:
                    text = _random_walk(compiled.matcher(), rng)
                except RepeatOnly:
                    continue
                if text is not None:
                    instance = parsed(text)
                    assert valid(schema, instance), (schema, text)
                    written += 1
        assert written > RANDOM_SCHEMAS // 4


def _random_walk(matcher, rng: random.Random, longest: int = 160) -> bytes | None:
    """Bytes the grammar allows, each drawn at random, until it lets the walk stop (None: not in `longest`)."""
    out = b""
    for _ in range(longest):
        allowed = allowed_tokens(matcher)
        if STOP in allowed and (len(allowed) == 1 or rng.random() < 0.3):
            return out
        token = rng.choice([t for t in allowed if t != STOP])
        assert matcher.accept(token)
        out += bytes([token])
    return None


def parsed(text: str | bytes) -> Any:
    """The JSON value of `text`; ValueError where it is not JSON, or writes a key twice in an object (which
    json.loads would take, keeping the last)."""
    return json.loads(text, object_pairs_hook=_keys_once)


def _keys_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) < len(keys):
        raise ValueError(f"key {next(key for key in keys if keys.count(key) > 1)!r} written twice")
    return dict(pairs)
