"""What xgrammar enforces, what it does not, and that the engine refuses the latter.

The probes walk a byte-per-token vocabulary through an instance that breaks one keyword: where the grammar still
accepts it, xgrammar does not enforce that keyword. A newer xgrammar that changes any of this fails here.
"""

import pytest

from plugd.runner_api import GrammarRefused
from plugd.testing.grammar import BYTES, GrammarEngineChecks, P
from plugd_xgrammar.engine import XGrammarEngine


class TestEveryEngineChecks(GrammarEngineChecks):
    factory = XGrammarEngine
    # A regex is one thing xgrammar's format check cannot tell; its length-bounded strings take control characters.
    refused_probes = frozenset({"format regex", "minLength", "maxLength"})


@pytest.fixture(scope="module")
def engine():
    return XGrammarEngine(BYTES)


REFUSED = [  # (schema, words the refusal names)
    ({"type": "integer", "not": {"const": 1}}, "'not' at /"),
    ({"type": "array", "contains": {"const": 1}}, "'contains'"),
    ({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True}, "'uniqueItems'"),
    ({"type": "object", "properties": P, "if": {"properties": {"c": {"const": "x"}}}, "then": {"required": ["a"]}},
     "'then'"),
    ({"type": "object", "properties": P, "dependentRequired": {"a": ["b"]}}, "'dependentRequired'"),
    ({"type": "object", "properties": P, "dependencies": {"a": ["b"]}}, "'dependencies'"),
    ({"type": "object", "unevaluatedProperties": False, "anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
     "'unevaluatedProperties'"),
    ({"type": "object", "properties": {"x": {"type": "integer"}}, "patternProperties": {"^x": {"minimum": 0}}},
     "property 'x' matching patternProperties '^x'"),
    ({"type": "object", "properties": {"y": {}}, "propertyNames": {"pattern": "^x"}}, "'propertyNames' together"),
    ({"type": "object", "additionalProperties": False, "propertyNames": {"pattern": "^a"}}, "'propertyNames' together"),
    ({"enum": [[1], {"a": 1}], "additionalProperties": False}, "keywords beside 'enum' (additionalProperties) at /"),
    ({"type": "object", "properties": {"p": {"anyOf": [{"format": "ipv4"}]}}},
     "format 'ipv4' without type 'string' at /properties/p/anyOf/0"),
    ({"type": "string", "format": "email", "pattern": "^a"}, "format 'email' together with a pattern"),
    ({"minimum": 2}, "'minimum' without type 'number' at /"),
    ({"type": "string", "maxLength": 3}, "'maxLength' on strings (xgrammar writes control characters raw"),
    ({"properties": {"p": {"maxLength": 1}}}, "'maxLength' without type 'string' at /properties/p"),
    ({"anyOf": [{"minItems": 2}, {"type": "null"}]}, "'minItems' without type 'array' at /anyOf/0"),
    ({"maxProperties": 0}, "'maxProperties' without type 'object' at /"),
    ({"type": "string", "format": "idn-email"}, "format 'idn-email'"),
    ({"$defs": {"d": {"type": "object"}}, "properties": {"p": {"$ref": "#/$defs/d", "required": ["u"]}}},
     "keywords beside $ref (properties, required) at /properties/p"),
    ({"type": "integer", "minimum": 1, "exclusiveMinimum": True}, "'exclusiveMinimum' as a boolean (draft-04)"),
    # Keywords beside a combinator that plugd.schema_rewrites cannot merge into its branches exactly.
    ({"type": "object", "properties": P, "additionalProperties": False, "anyOf": [{"properties": {"z": {}}}]},
     "keywords beside 'anyOf' (additionalProperties, properties, type) at /"),
    ({"oneOf": [{"type": "string", "pattern": "^a"}, {"type": "string"}], "pattern": "b$"},
     "keywords beside 'oneOf' (pattern) at /"),
    ({"type": "object", "properties": P, "additionalProperties": False, "allOf": [{"properties": {"z": {}}}]},
     "keywords beside 'allOf' (additionalProperties, properties, type)"),
    # the rest come from xgrammar's own warnings or errors
    ({"type": "string", "pattern": "^(?!a)\\w+$"}, "Lookahead"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf with overlapping"),
    ({"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]}, "allOf"),
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
