"""What xgrammar enforces, what it does not, and that the engine refuses the latter.

The probes walk a byte-per-token vocabulary through an instance that breaks one keyword: where the grammar still
accepts it, xgrammar does not enforce that keyword. A newer xgrammar that changes any of this fails here.
"""

import json

import numpy as np
import pytest

from plugd.runner_api import GrammarRefused, GrammarVocabulary
from plugd_xgrammar.engine import XGrammarEngine

STOP = 256
BYTES = GrammarVocabulary([bytes([b]) for b in range(256)] + [b""], frozenset({STOP}))
P = {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "string"}}


@pytest.fixture(scope="module")
def engine():
    return XGrammarEngine(BYTES)


def accepts(engine: XGrammarEngine, schema: dict, instance) -> bool:
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


@pytest.mark.parametrize("keyword, schema, breaking", ENFORCED, ids=[case[0] for case in ENFORCED])
def test_xgrammar_enforces(engine, keyword, schema, breaking):
    assert not accepts(engine, schema, breaking)


@pytest.mark.parametrize("fmt, value", [("date", "2024-02-29"), ("date", "2000-02-29"), ("date", "0004-12-31"),
                                        ("date-time", "1999-12-31T23:59:59.999+05:30"), ("time", "00:00:00Z")])
def test_real_dates_and_times_get_through(engine, fmt, value):
    assert accepts(engine, {"type": "string", "format": fmt}, value)


REFUSED = [  # (schema, words the refusal names)
    ({"type": "integer", "not": {"const": 1}}, "'not' at /"),
    ({"type": "array", "contains": {"const": 1}}, "'contains'"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "'uniqueItems'"),
    ({"type": "object", "properties": P, "if": {"properties": {"c": {"const": "x"}}}, "then": {"required": ["a"]}},
     "'then'"),
    ({"type": "object", "properties": P, "dependentRequired": {"a": ["b"]}}, "'dependentRequired'"),
    ({"type": "object", "properties": P, "dependencies": {"a": ["b"]}}, "'dependencies'"),
    ({"type": "object", "properties": {"a": {}}, "unevaluatedProperties": False}, "'unevaluatedProperties'"),
    ({"type": "object", "properties": {"x": {"type": "integer"}}, "patternProperties": {"^x": {"minimum": 0}}},
     "property 'x' matching patternProperties '^x'"),
    ({"type": "object", "properties": {"y": {}}, "propertyNames": {"pattern": "^x"}}, "'propertyNames' together"),
    ({"type": "object", "properties": {"p": {"type": "string", "anyOf": [{"format": "ipv4"}]}}},
     "format 'ipv4' without type 'string' at /properties/p/anyOf/0"),
    ({"type": "string", "format": "email", "pattern": "^a"}, "format 'email' together with a pattern"),
    ({"type": "string", "format": "idn-email"}, "format 'idn-email'"),
    ({"$defs": {"d": {"type": "object"}}, "properties": {"p": {"$ref": "#/$defs/d", "required": ["u"]}}},
     "keywords beside $ref (required) at /properties/p"),
    ({"type": "integer", "minimum": 1, "exclusiveMinimum": True}, "'exclusiveMinimum' as a boolean (draft-04)"),
    # the rest come from xgrammar's own warnings or errors
    ({"type": "string", "pattern": "^(?!a)\\w+$"}, "Lookahead"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf with overlapping"),
    ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, "allOf"),
    ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
    ({"type": "string", "pattern": "^a+$", "minLength": 3}, "pattern combined with minLength"),
    ({"$ref": "http://example.com/remote.json"}, "URI"),
    ({"type": "string", "pattern": "\\bword\\b"}, "Regex parsing error"),
    ({"type": "array", "items": [{"type": "integer"}], "additionalItems": False}, "items must be"),
]


@pytest.mark.parametrize("schema, named", REFUSED, ids=[case[1] for case in REFUSED])
def test_what_xgrammar_would_not_enforce_is_refused_by_name(engine, schema, named):
    with pytest.raises(GrammarRefused, match="JSON schema") as refusal:
        engine.compile("json_schema", schema)
    assert named in str(refusal.value)


def test_draft_07_ignores_keywords_beside_ref_so_they_need_no_enforcing(engine):
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "$defs": {"d": {"type": "object"}},
              "properties": {"p": {"$ref": "#/$defs/d", "required": ["u"]}}}
    engine.compile("json_schema", schema)


def test_annotations_and_unknown_formats_pass(engine):
    schema = {"type": "object", "title": "t", "description": "d", "examples": [{"not": 1}], "default": {"not": 2},
              "properties": {"n": {"type": "string", "format": "int32", "x-custom": True, "enum": ["not", "if"]}}}
    engine.compile("json_schema", schema)
