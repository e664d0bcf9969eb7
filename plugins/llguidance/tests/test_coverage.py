"""What llguidance enforces, what it does not, and that the engine refuses the latter.

The probes (plugd.testing.grammar) walk a byte-per-token vocabulary through an instance that breaks one keyword:
where the grammar still accepts it, llguidance does not enforce that keyword. A newer llguidance that changes
any of this fails here.
"""

import pytest

from plugd.runner_api import GrammarRefused
from plugd.testing.grammar import BYTES, GrammarEngineChecks, P, accepts
from plugd_llguidance.engine import LLGuidanceEngine

# What llguidance enforces beyond the probes every engine passes.
ALSO_ENFORCED = [
    ("pattern beside minLength", {"type": "string", "pattern": "^a+$", "minLength": 3}, "aa"),
    ("pattern beside maxLength", {"type": "string", "pattern": "^a+$", "maxLength": 2}, "aaa"),
    ("multipleOf on numbers", {"type": "number", "multipleOf": 0.5}, 0.3),
    ("allOf of several schemas", {"allOf": [{"type": "integer"}, {"minimum": 3}]}, 2),
    ("allOf's other branch", {"allOf": [{"type": "integer"}, {"minimum": 3}]}, 3.5),
    ("properties and a matching pattern", {"type": "object", "properties": {"x": {"type": "integer"}},
                                           "patternProperties": {"^x": {"minimum": 0}}}, {"x": -1}),
    ("format beside a pattern", {"type": "string", "format": "email", "pattern": "^a"}, "b@example.com"),
    ("a pattern beside a format", {"type": "string", "format": "email", "pattern": "^a"}, "abc"),
    ("keywords beside $ref", {"$defs": {"d": {"type": "object"}},
                              "properties": {"p": {"$ref": "#/$defs/d", "required": ["u"]}}}, {"p": {}}),
    ("oneOf of distinct consts", {"oneOf": [{"const": "a"}, {"const": "b"}]}, "c"),
]




class TestEveryEngineChecks(GrammarEngineChecks):
    factory = LLGuidanceEngine
    refused_probes = frozenset({"propertyNames alone"})  # see REFUSED


@pytest.fixture(scope="module")
def engine():
    return LLGuidanceEngine(BYTES)


@pytest.mark.parametrize("keyword, schema, breaking", ALSO_ENFORCED, ids=[case[0] for case in ALSO_ENFORCED])
def test_llguidance_enforces(engine, keyword, schema, breaking):
    assert not accepts(engine, schema, breaking)


REFUSED = [  # (schema, words the refusal names)
    ({"type": "integer", "not": {"const": 1}}, "'not' at /"),
    ({"type": "array", "contains": {"const": 1}}, "'contains'"),
    ({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True}, "'uniqueItems'"),
    ({"type": "object", "properties": P, "if": {"properties": {"c": {"const": "x"}}}, "then": {"required": ["a"]}},
     "'if' at /; 'then' at /"),
    ({"type": "object", "dependentSchemas": dict.fromkeys("abcd", {"required": ["z"]})}, "'dependentSchemas'"),
    ({"type": "object", "unevaluatedProperties": False, "anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
     "'unevaluatedProperties'"),
    ({"type": "object", "propertyNames": {"pattern": "^x"}}, "'propertyNames' at /"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "'oneOf' whose branches it cannot prove exclusive at /"),
    ({"type": "string", "format": "idn-email"}, "format 'idn-email' at /"),
    ({"type": "string", "format": "date", "pattern": "^2"}, "format 'date' together with a pattern"),
    ({"type": "integer", "minimum": 1, "exclusiveMinimum": True}, "'exclusiveMinimum' as a boolean (draft-04)"),
    ({"type": "array", "items": [{"type": "integer"}], "additionalItems": False}, "'items' as a list"),
    ({"type": "string", "pattern": "^(?!a)\\w+$"}, "look-around"),
    ({"$ref": "http://example.com/remote.json"}, "remote.json"),
    (False, "false allows no value at /"),
]


@pytest.mark.parametrize("schema, named", REFUSED, ids=[case[1] for case in REFUSED])
def test_what_llguidance_would_not_enforce_is_refused_by_name(engine, schema, named):
    with pytest.raises(GrammarRefused, match="llguidance cannot enforce this JSON schema") as refusal:
        engine.compile("json_schema", schema)
    assert named in str(refusal.value)


def test_every_problem_is_named_not_only_the_first(engine):
    schema = {"type": "object", "properties": {"t": {"type": "array", "uniqueItems": True}, "n": {"not": {"const": 1}},
                                               "o": {"oneOf": [{"type": "string"}, {"type": "string", "minLength": 2}]}}}
    with pytest.raises(GrammarRefused) as refusal:
        engine.compile("json_schema", schema)
    assert str(refusal.value) == ("llguidance cannot enforce this JSON schema: 'uniqueItems' at /properties/t; "
                                  "'not' at /properties/n; 'oneOf' whose branches it cannot prove exclusive at "
                                  "/properties/o")


def test_json_is_written_compactly(engine):
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}, "required": ["a"]}
    assert accepts(engine, schema, {"a": [1, 2]})  # json.dumps: ", " and ": "
    for written in (b'{"a":[', b'{"a":  ', b'{"a": [1,2', b'{ "a'):
        matcher = engine.compile("json_schema", schema).matcher()
        assert not all(matcher.accept(token) for token in written), written
