"""plugd.schema_rewrites against jsonschema on random schemas: a rewritten schema takes exactly the instances the
original takes (formats asserted), in both of rewritten's modes. The schemas mix the keywords the rewrites
read, nested, beside local $refs and in both dialects of $ref's siblings; the instances are small values of
every type. Found on the way: a combinator pair (anyOf beside oneOf) that crashed the distribution, dependency
schemas rewritten on values that are not objects, rewrites under an unevaluatedProperties that reads their
annotations, and recursive definitions unrolled round after round."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from plugd.schema_rewrites import rewritten

KEYS = ["a", "b", "c"]
SCHEMAS = 2000
INSTANCES = 30
_LEAVES = [{"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "null"}, {"type": "object"},
           {"type": "array"}, {"enum": ["x", 1, None]}, {"const": "x"}, {}, True, False, {"minimum": 2},
           {"maxLength": 1}, {"type": "string", "pattern": "^[xy]*$"}, {"format": "uuid"}, {"not": {"enum": ["x", 1]}},
           {"$ref": "#/$defs/e"}]


def random_schema(rng: random.Random, depth: int):
    if depth <= 0 or rng.random() < 0.25:
        return rng.choice(_LEAVES)
    node = {}
    for keyword in rng.sample(list(_KEYWORDS), rng.randint(1, 4)):
        node.update(_KEYWORDS[keyword](rng, depth - 1))
    return node


_KEYWORDS = {
    "type": lambda rng, d: {"type": rng.choice(["object", "string", "integer", ["object", "null"], ["integer", "string"]])},
    "enum": lambda rng, d: {"enum": rng.sample(["x", "y", 1, 2, None, {"a": 1}, [1]], rng.randint(1, 4))},
    "const": lambda rng, d: {"const": rng.choice(["x", 1, {"a": 1}])},
    "properties": lambda rng, d: {"properties": {k: random_schema(rng, d) for k in rng.sample(KEYS, rng.randint(1, 3))}},
    "required": lambda rng, d: {"required": rng.sample(KEYS, rng.randint(1, 2))},
    "additionalProperties": lambda rng, d: {"additionalProperties": rng.choice([False, True, {"type": "integer"}])},
    "patternProperties": lambda rng, d: {"patternProperties": {"^a": random_schema(rng, d)}},
    "allOf": lambda rng, d: {"allOf": [random_schema(rng, d) for _ in range(rng.randint(1, 3))]},
    "anyOf": lambda rng, d: {"anyOf": [random_schema(rng, d) for _ in range(rng.randint(1, 3))]},
    "oneOf": lambda rng, d: {"oneOf": [random_schema(rng, d) for _ in range(rng.randint(1, 3))]},
    "not": lambda rng, d: {"not": random_schema(rng, d)},
    "bounds": lambda rng, d: {rng.choice(["minimum", "maximum", "minLength", "minItems", "minProperties",
                                          "maxProperties"]): rng.randint(0, 3)},
    "multipleOf": lambda rng, d: {"multipleOf": rng.choice([1, 2, 0.5])},
    "items": lambda rng, d: {"items": random_schema(rng, d)},
    "dependentRequired": lambda rng, d: {"dependentRequired": {rng.choice(KEYS): rng.sample(KEYS, 1)}},
    "dependentSchemas": lambda rng, d: {"dependentSchemas": {rng.choice(KEYS): random_schema(rng, d)}},
    "if": lambda rng, d: {"if": rng.choice([{"properties": {"a": {"const": "x"}}}, {"required": ["a"]}]),
                          "then": random_schema(rng, d), "else": random_schema(rng, d)},
    "propertyNames": lambda rng, d: {"propertyNames": rng.choice([{"type": "string"}, {"pattern": "^a"},
                                                                   {"pattern": "^[ab]+$", "maxLength": 1}])},
    "unevaluatedProperties": lambda rng, d: {"unevaluatedProperties": rng.choice([False, {"type": "integer"}])},
    "$ref": lambda rng, d: {"$ref": "#/$defs/e"},
}


def random_instance(rng: random.Random, depth: int = 2):
    pick = rng.random()
    if depth <= 0 or pick < 0.4:
        return rng.choice(["x", "y", "", "xy", 0, 1, 2, 3, 1.5, None, True, "123e4567-e89b-12d3-a456-426614174000"])
    if pick < 0.8:
        return {k: random_instance(rng, depth - 1) for k in rng.sample([*KEYS, "z"], rng.randint(0, 3))}
    return [random_instance(rng, depth - 1) for _ in range(rng.randint(0, 3))]


def valid(schema, instance) -> bool:
    validator = jsonschema.validators.validator_for(schema)
    return validator(schema, format_checker=validator.FORMAT_CHECKER).is_valid(instance)


@pytest.mark.parametrize("seed", range(4))
def test_rewritten_schemas_take_the_same_instances(seed):
    rng, compared = random.Random(seed), 0
    for _ in range(SCHEMAS // 4):
        schema = json.loads(json.dumps(random_schema(rng, 3)))  # its leaves are shared: a copy of its own
        if not isinstance(schema, dict):
            continue
        schema["$defs"] = {"e": {"type": "object", "properties": {"a": rng.choice(_LEAVES[:-1])},
                                 "additionalProperties": rng.choice([True, False])}}
        if rng.random() < 0.5:
            schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        instances = [random_instance(rng) for _ in range(INSTANCES)]
        for false_schemas in (True, False):
            after = rewritten(schema, false_schemas=false_schemas)
            for instance in instances:
                assert valid(after, instance) == valid(schema, instance), (schema, after, instance)
                compared += 1
    assert compared > SCHEMAS // 4 * INSTANCES  # most schemas are objects, each compared in both modes
