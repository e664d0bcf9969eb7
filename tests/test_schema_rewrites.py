"""plugd.schema_rewrites: each rewrite is exact, checked against jsonschema and through a real engine, and each
has a schema it must leave alone for the engine to refuse."""

from __future__ import annotations

import jsonschema
import pytest

from plugd.runner_api import GrammarRefused
from plugd.schema_rewrites import rewritten
from plugd.testing.grammar import BYTES, accepts
from plugd_llguidance.engine import LLGuidanceEngine

P = {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "string"}}
OBJECTS = [{}, {"a": "x"}, {"b": 1}, {"a": "x", "b": 1}, {"a": "x", "c": "y"}, {"a": "x", "b": 1, "c": "y"},
           {"c": "y"}, {"b": 1, "c": "y"}]
VALUES = [*OBJECTS, None, 1, "s", [1], True]
CONDITIONED = [{}, {"a": "s"}, {"a": "s", "c": "x"}, {"a": "s", "c": "y"}, {"a": "s", "b": 1, "c": "y"}, {"c": "x"},
               {"b": 1, "c": "x"}, {"a": "s", "c": "z"}, {"a": "s", "b": 1}]
DRAFT_7 = "http://json-schema.org/draft-07/schema#"  # where `dependencies` is a keyword

EXACT = [  # (rule, schema, the keyword it takes away, instances)
    ("not {} allows nothing", {"type": "object", "properties": {"a": {"not": {}}, "b": P["b"]}}, "not", OBJECTS),
    ("not required: absent", {"type": "object", "properties": P, "not": {"required": ["a"]}}, "not", VALUES),
    ("dependentRequired", {"type": "object", "properties": P, "dependentRequired": {"a": ["b"]}},
     "dependentRequired", VALUES),
    ("dependencies as lists", {"$schema": DRAFT_7, "properties": P, "dependencies": {"a": ["b"], "c": ["a", "b"]}},
     "dependencies", VALUES),
    ("dependencies beside required", {"$schema": DRAFT_7, "type": "object", "properties": P, "required": ["a"],
                                      "dependencies": {"a": ["c"], "b": ["c"]}}, "dependencies", OBJECTS),
    ("if on one property's listed values", {"$schema": DRAFT_7, "type": "object", "properties": {
        "a": P["a"], "b": P["b"], "c": {"type": "string", "enum": ["x", "y", "z"]}},
        "if": {"properties": {"c": {"enum": ["y"]}}}, "then": {"required": ["a", "b"]}, "else": {"required": ["a"]}},
     "if", CONDITIONED),
    ("if that requires the key", {"type": "object", "properties": {"a": P["a"], "b": P["b"], "c": {"enum": ["x", "y"]}},
                                  "if": {"properties": {"c": {"const": "x"}}, "required": ["c"]},
                                  "then": {"required": ["b"]}}, "if", CONDITIONED),
    ("oneOf of distinct types", {"oneOf": [{"type": "integer"}, {"type": "array"}, {"enum": ["x", "y"]}]},
     "oneOf", [1, 1.5, [1], "x", "z", None]),
    ("oneOf with a const discriminator", {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}, "n": P["b"]}, "required": ["kind"]},
        {"type": "object", "properties": {"kind": {"enum": ["b", "c"]}, "s": P["a"]}, "required": ["kind", "s"]},
    ]}, "oneOf", [{"kind": "a"}, {"kind": "b", "s": "x"}, {"kind": "b"}, {"kind": "d"}, {}, {"kind": "a", "n": 1}]),
    ("oneOf: a key one branch requires, the other forbids", {"$defs": {"ref": {
        "type": "object", "properties": {"ref": P["a"]}, "required": ["ref"], "additionalProperties": False}},
        "oneOf": [{"$ref": "#/$defs/ref"}, {"type": "object", "properties": {"a": P["a"]}, "required": ["a"],
                                             "additionalProperties": False}]},
     "oneOf", [{"ref": "x"}, {"a": "x"}, {"ref": "x", "a": "x"}, {}]),
]
KEPT = [  # (why the rewrite would not be exact, schema, the keyword left for the engine)
    ("not of more than a key", {"type": "object", "properties": P, "not": {"required": ["a"], "minProperties": 2}},
     "not"),
    ("not required on an untyped schema (it also refuses non-objects)", {"properties": P, "not": {"required": ["a"]}},
     "not"),
    ("dependencies on a schema", {"type": "object", "properties": P, "dependencies": {"a": {"required": ["b"]}}},
     "dependencies"),
    ("more dependencies than MAX_DEPENDENCIES", {"type": "object", "dependentRequired": {
        "a": ["z"], "b": ["z"], "c": ["z"], "d": ["z"]}}, "dependentRequired"),
    ("if on a property whose values the schema does not list", {"type": "object", "properties": P,
                                                                 "if": {"properties": {"a": {"const": "x"}}},
                                                                 "then": {"required": ["b"]}}, "if"),
    ("then that judges properties by the names beside it", {
        "type": "object", "properties": {"a": P["a"], "c": {"enum": ["x", "y"]}},
        "if": {"properties": {"c": {"const": "x"}}}, "then": {"additionalProperties": False}}, "if"),
    ("oneOf whose branches overlap ({} is both)", {"oneOf": [
        {"type": "object", "properties": {"a": P["a"]}, "additionalProperties": False},
        {"type": "object", "properties": {"b": P["b"]}, "additionalProperties": False}]}, "oneOf"),
    ("oneOf with integer and number", {"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
    ("oneOf whose discriminators share a value", {"oneOf": [
        {"type": "object", "properties": {"k": {"enum": [1, 2]}}, "required": ["k"]},
        {"type": "object", "properties": {"k": {"const": 2.0}}, "required": ["k"]}]}, "oneOf"),
]


@pytest.fixture(scope="module")
def engine():
    return LLGuidanceEngine(BYTES)


@pytest.mark.parametrize(("rule", "schema", "keyword", "instances"), EXACT, ids=[case[0] for case in EXACT])
def test_a_rewrite_is_exact(engine, rule, schema, keyword, instances):
    after = rewritten(schema)
    assert keyword not in str(after)
    valid = [jsonschema.validators.validator_for(schema)(schema).is_valid(instance) for instance in instances]
    assert [jsonschema.validators.validator_for(after)(after).is_valid(instance) for instance in instances] == valid
    assert True in valid and False in valid  # the instances tell the schema's yes from its no
    assert [accepts(engine, schema, instance) for instance in instances] == valid


@pytest.mark.parametrize(("why", "schema", "keyword"), KEPT, ids=[case[0] for case in KEPT])
def test_what_cannot_be_rewritten_exactly_is_left_and_refused(engine, why, schema, keyword):
    assert rewritten(schema) == schema
    with pytest.raises(GrammarRefused, match=f"'{keyword}'"):
        engine.compile("json_schema", schema)


def test_the_schema_given_is_left_as_it_was():
    schema = {"type": "object", "properties": P, "not": {"required": ["a"]}, "dependentRequired": {"b": ["c"]}}
    before = repr(schema)
    rewritten(schema)
    assert repr(schema) == before
