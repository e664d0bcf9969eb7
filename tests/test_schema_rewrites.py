"""plugd.schema_rewrites: each rewrite is exact, checked against jsonschema and through a real engine, and each
has a schema it must leave alone for the engine to refuse."""

from __future__ import annotations

import json

import jsonschema
import pytest

from plugd.runner_api import GrammarRefused
from plugd.schema_rewrites import rewritten
from plugd.testing.grammar import BYTES, accepts
from plugd_llguidance.engine import LLGuidanceEngine
from plugd_xgrammar.engine import XGrammarEngine

P = {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "string"}}
OBJECTS = [{}, {"a": "x"}, {"b": 1}, {"a": "x", "b": 1}, {"a": "x", "c": "y"}, {"a": "x", "b": 1, "c": "y"},
           {"c": "y"}, {"b": 1, "c": "y"}]
VALUES = [*OBJECTS, None, 1, "s", [1], True]
CONDITIONED = [{}, {"a": "s"}, {"a": "s", "c": "x"}, {"a": "s", "c": "y"}, {"a": "s", "b": 1, "c": "y"}, {"c": "x"},
               {"b": 1, "c": "x"}, {"a": "s", "c": "z"}, {"a": "s", "b": 1}]
DRAFT_7 = "http://json-schema.org/draft-07/schema#"  # where `dependencies` is a keyword
DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"  # where keywords beside a $ref apply
UUID = "123e4567-e89b-12d3-a456-426614174000"

EXACT = [  # (rule, schema, the keyword it takes away, instances); every engine that compiles it must be exact
    ("allOf of object parts", {"type": "object", "allOf": [
        {"$ref": "#/$defs/named"}, {"properties": {"b": P["b"]}, "required": ["b"], "title": "with b"}],
        "$defs": {"named": {"type": "object", "properties": {"a": P["a"]}, "required": ["a"]}}},
     "allOf", [*OBJECTS, {"a": 1, "b": 1}, {"a": "x", "b": "y"}, 1]),
    ("allOf of ranges", {"allOf": [{"type": "integer"}, {"minimum": 2}, {"maximum": 4}]}, "allOf",
     [1, 2, 4, 5, 3.5, "3"]),
    ("allOf with false", {"type": "object", "properties": {"a": {"allOf": [P["a"], False]}}}, "allOf",
     [{}, {"a": "x"}]),
    ("keywords beside anyOf, into its branches", {"type": "integer", "anyOf": [{"minimum": 2}, {"const": 0}]},
     "'type': 'integer', 'anyOf'", [0, 2, 3, 1, 2.5, "a", None]),
    ("properties beside oneOf, into its branches", {
        "type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "n": P["b"], "s": P["a"]},
        "required": ["kind"], "additionalProperties": False,
        "oneOf": [{"properties": {"kind": {"const": "a"}, "n": P["b"]}, "required": ["n"]},
                  {"properties": {"kind": {"const": "b"}, "s": {"enum": ["x", "y"]}}}]},
     "oneOf", [{"kind": "a", "n": 1}, {"kind": "a"}, {"kind": "b"}, {"kind": "b", "s": ""}, {"kind": "b", "s": "x"},
               {"n": 1}, {"kind": "a", "n": 1, "z": 1}, {"kind": "c"}]),
    ("oneOf of closed objects that share only {}", {"oneOf": [
        {"type": "object", "properties": {"foo": P["a"]}, "additionalProperties": False},
        {"type": "object", "properties": {"bar": P["a"]}, "additionalProperties": False},
        {"type": "array"}]},
     "oneOf", [{}, {"foo": "x"}, {"bar": "y"}, {"foo": "x", "bar": "y"}, {"z": 1}, [], "s"]),
    ("whole multipleOf on a number", {"type": "number", "multipleOf": 2}, "number", [0, 2, 4, 3, 2.5, -2]),
    ("multipleOf 1 on a number, bounded below", {"type": "number", "multipleOf": 1, "minimum": 0}, "multipleOf",
     [0, 1, 7, -1, 0.5]),
    ("multipleOf in a range", {"type": "integer", "multipleOf": 5, "exclusiveMinimum": 0, "maximum": 20.5}, "multipleOf",
     [0, 5, 20, 25, 7, -5]),
    ("multipleOf on a number in a range", {"type": "number", "multipleOf": 3.0, "minimum": -3.5, "maximum": 6},
     "multipleOf", [-3, 0, 6, 9, -6, 1]),
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
    ("allOf: one keyword in two parts", {"allOf": [
        {"type": ["integer", "string"], "minimum": 1, "maxLength": 3}, {"type": "number", "minimum": 2, "maximum": 9}]},
     "allOf", [1, 2, 9, 10, 2.5, "ab", None]),
    ("allOf: items in two parts", {"allOf": [{"type": "array", "items": {"type": "integer"}}, {"items": {"minimum": 0}}]},
     "allOf", [[], [1], [-1], [1.5], [0, 2]]),
    ("listed values, the keywords beside applied to them", {
        "type": "string", "enum": ["a", "bb", "ccc", 1], "minLength": 2, "not": {"enum": ["ccc"]}},
     "not", ["a", "bb", "ccc", "dd", 1]),
    ("listed values beside a oneOf: enums met, a branch that requires what it forbids", {
        "type": "object", "properties": {"k": {"enum": ["a", "b", "c"]}, "n": P["b"]}, "required": ["k"],
        "oneOf": [{"properties": {"k": {"enum": ["a", "x"]}}},
                  {"properties": {"k": {"not": {"enum": ["a", "b"]}}}},
                  {"properties": {"k": {"const": "x"}}}]},
     "oneOf", [{"k": "a"}, {"k": "b"}, {"k": "c"}, {"k": "x"}, {}, {"k": "c", "n": 1}]),
    ("dependencies on a schema and on a list", {"$schema": DRAFT_7, "type": "object", "properties": P,
                                                "dependencies": {"a": {"required": ["b"]}, "c": ["a"]}},
     "dependencies", OBJECTS),
    ("dependentSchemas", {"type": "object", "properties": P, "dependentSchemas": {"a": {"properties": {"b": {"minimum": 2}}}}},
     "dependentSchemas", [{}, {"a": "x"}, {"a": "x", "b": 1}, {"a": "x", "b": 3}, {"b": 1}]),
    ("oneOf of equal branches allows nothing", {"type": "object", "properties": {
        "a": P["a"], "b": {"oneOf": [{"type": "integer"}, {"type": "integer"}]}}},
     "oneOf", [{}, {"a": "x"}, {"b": 1}, {"b": "s"}]),
    ("not required of keys the schema requires allows nothing", {"type": "object", "properties": {
        "a": P["a"], "b": {"type": "object", "required": ["x"], "not": {"required": ["x"]}}}},
     "not", [{}, {"a": "x"}, {"b": {"x": 1}}, {"b": {}}]),
    ("propertyNames every string meets", {
        "type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {"type": "integer"}},
     "propertyNames", [{}, {"a": 1}, {"a": "s"}, []]),
    ("propertyNames as one pattern with its lengths", {
        "type": "object", "propertyNames": {"$ref": "#/$defs/id"}, "additionalProperties": {"type": "integer"},
        "$defs": {"id": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}}},
     "propertyNames", [{}, {"ab": 1}, {"abcd": 1}, {"aB": 1}, {"ab": "s"}, {"": 1}, {"a": 1, "b": 2}]),
    ("required keys beyond properties, named there", {
        "type": "object", "properties": {"c": {}}, "required": ["a"], "additionalProperties": {"type": "integer"}},
     None, [{}, {"a": 1}, {"c": 1}, {"a": "s"}, {"a": 1, "z": "s"}]),
    ("minProperties the required keys meet", {"type": "object", "required": ["a", "b"], "minProperties": 2},
     "minProperties", [{}, {"a": 1}, {"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}]),
    ("oneOf of branches about strings only", {"oneOf": [{"format": "uuid"}, {"pattern": "^\\$[A-Z]+"}]},
     "oneOf", ["$AB", UUID, "x", "$", 1, None]),
    ("unevaluatedProperties beside a part with additionalProperties", {
        "$schema": DRAFT_2020_12, "$defs": {"open": {
            "type": "object", "properties": {"a": P["a"]}, "additionalProperties": {"type": "integer"}}},
        "$ref": "#/$defs/open", "unevaluatedProperties": False},
     "unevaluated", [{"a": "x"}, {"a": 1}, {"z": 1}, {"z": "s"}]),
    ("unevaluatedProperties with nothing applied in place", {
        "type": "object", "properties": {"a": P["a"]}, "unevaluatedProperties": False},
     "unevaluated", [{}, {"a": "x"}, {"z": 1}]),
    ("$ref beside other keywords (2020-12)", {
        "$schema": DRAFT_2020_12, "$defs": {"a": {"type": "object", "properties": {"a": P["a"]}, "required": ["a"]}},
        "type": "object", "$ref": "#/$defs/a", "properties": {"b": P["b"]}, "required": ["b"]},
     "$ref", OBJECTS),
]
# The rewrites that bring a schema within xgrammar's reach (it refuses the rest for their `false` subschemas).
XGRAMMAR_TOO = {"keywords beside anyOf, into its branches", "properties beside oneOf, into its branches",
                "allOf of object parts", "allOf of ranges", "whole multipleOf on a number", "multipleOf in a range",
                "multipleOf 1 on a number, bounded below", "multipleOf on a number in a range",
                "required keys beyond properties, named there", "minProperties the required keys meet",
                "allOf: one keyword in two parts", "allOf: items in two parts"}
KEPT = [  # (why the rewrite would not be exact, schema, the keyword left for the engine to refuse)
    ("not of more than a key", {"type": "object", "properties": P, "not": {"required": ["a"], "minProperties": 2}},
     "not"),
    ("not required on an untyped schema (it also refuses non-objects)", {"properties": P, "not": {"required": ["a"]}},
     "not"),
    ("more dependencies than MAX_DEPENDENCIES", {"type": "object", "dependentRequired": {
        "a": ["z"], "b": ["z"], "c": ["z"], "d": ["z"]}}, "dependentRequired"),
    ("if on a property whose values the schema does not list", {"type": "object", "properties": P,
                                                                 "if": {"properties": {"a": {"const": "x"}}},
                                                                 "then": {"required": ["b"]}}, "if"),
    ("then that judges properties by the names beside it", {
        "type": "object", "properties": {"a": P["a"], "c": {"enum": ["x", "y"]}},
        "if": {"properties": {"c": {"const": "x"}}}, "then": {"additionalProperties": False}}, "if"),
    ("oneOf of closed objects naming a property both", {"oneOf": [
        {"type": "object", "properties": {"foo": P["a"], "bar": P["b"]}, "additionalProperties": False},
        {"type": "object", "properties": {"bar": P["b"]}, "additionalProperties": False}]}, "oneOf"),
    ("oneOf with integer and number", {"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
    ("oneOf whose discriminators share a value", {"oneOf": [
        {"type": "object", "properties": {"k": {"enum": [1, 2]}}, "required": ["k"]},
        {"type": "object", "properties": {"k": {"const": 2.0}}, "required": ["k"]}]}, "oneOf"),
    ("oneOf of strings that may start alike", {"type": "string", "oneOf": [{"pattern": "^a"}, {"pattern": "^ab|c"}]},
     "oneOf"),
    ("oneOf of branches not only about strings", {"oneOf": [{"pattern": "^a"}, {"minimum": 1}]}, "oneOf"),
    ("listed values beside a not that is not decided value by value", {
        "type": "string", "enum": ["a", "b"], "not": {"pattern": "^a"}}, "not"),
    ("propertyNames beside properties", {"type": "object", "properties": {"a": {}},
                                          "propertyNames": {"pattern": "^[a-z]+$"}}, "propertyNames"),
    ("propertyNames of a pattern beyond one repeated class", {"type": "object",
                                                              "propertyNames": {"pattern": "^a[0-9]+$"}}, "propertyNames"),
    ("unevaluatedProperties beside an anyOf", {"type": "object", "unevaluatedProperties": False, "anyOf": [
        {"properties": {"a": P["a"]}}, {"properties": {"b": P["b"]}}]}, "unevaluatedProperties"),
]


# Left for xgrammar, which refuses allOf of several parts and multipleOf on numbers.
KEPT_FOR_XGRAMMAR = [
    ("allOf: additionalProperties in one part, properties in another", {"allOf": [
        {"type": "object", "properties": {"a": P["a"]}, "additionalProperties": False},
        {"properties": {"b": P["b"]}}]}, "allOf"),
    ("allOf: the same keyword with two values", {"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]},
     "allOf"),
    ("allOf: a part that is a remote $ref", {"allOf": [{"type": "object"}, {"$ref": "https://example.com/s"}]},
     "allOf"),
    ("fractional multipleOf on a number", {"type": "number", "multipleOf": 0.5}, "multipleOf"),
    ("multipleOf over too wide a range", {"type": "integer", "multipleOf": 2, "minimum": 0, "maximum": 100000},
     "range"),
]


def valid_under(schema, instance) -> bool:
    """As plugd reads a schema: the formats JSON Schema defines are asserted."""
    validator = jsonschema.validators.validator_for(schema)
    return validator(schema, format_checker=validator.FORMAT_CHECKER).is_valid(instance)


@pytest.fixture(scope="module")
def engines():
    return {"llguidance": LLGuidanceEngine(BYTES), "xgrammar": XGrammarEngine(BYTES)}


@pytest.mark.parametrize(("rule", "schema", "keyword", "instances"), EXACT, ids=[case[0] for case in EXACT])
def test_a_rewrite_is_exact(engines, rule, schema, keyword, instances):
    after = rewritten(schema)
    assert keyword is None or keyword not in str(after)
    valid = [valid_under(schema, instance) for instance in instances]
    assert [valid_under(after, instance) for instance in instances] == valid
    assert True in valid and False in valid  # the instances tell the schema's yes from its no
    served = []
    for name, engine in engines.items():
        try:
            engine.compile("json_schema", schema)
        except GrammarRefused:
            continue
        served.append(name)
        assert [accepts(engine, schema, instance) for instance in instances] == valid, name
    assert "llguidance" in served and (rule not in XGRAMMAR_TOO or "xgrammar" in served)


@pytest.mark.parametrize(("why", "schema", "keyword"), KEPT, ids=[case[0] for case in KEPT])
def test_what_cannot_be_rewritten_exactly_is_left_and_refused(engines, why, schema, keyword):
    assert f'"{keyword}"' in json.dumps(rewritten(schema))
    with pytest.raises(GrammarRefused, match=f"'{keyword}'"):
        engines["llguidance"].compile("json_schema", schema)


@pytest.mark.parametrize(("why", "schema", "keyword"), KEPT_FOR_XGRAMMAR, ids=[case[0] for case in KEPT_FOR_XGRAMMAR])
def test_what_xgrammar_cannot_take_unmerged_is_left_and_refused(engines, why, schema, keyword):
    assert rewritten(schema, false_schemas=False) == schema
    with pytest.raises(GrammarRefused, match=keyword):
        engines["xgrammar"].compile("json_schema", schema)


def test_the_schema_given_is_left_as_it_was():
    schema = {"type": "object", "properties": P, "not": {"required": ["a"]}, "dependentRequired": {"b": ["c"]}}
    before = repr(schema)
    rewritten(schema)
    assert repr(schema) == before
