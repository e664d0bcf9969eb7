"""Random JSON Schemas and instances, for differential tests of schema rewrites and grammar engines: the
keywords plugd.schema_rewrites reads and engines refuse or enforce, nested, beside a local $ref, in both of
$ref's dialects; instances are small values of every type.

`random_schema(rng)` gives a schema object with a `$defs` of its own; `valid` is jsonschema's verdict with the
formats JSON Schema defines asserted, as plugd reads a schema.
"""

from __future__ import annotations

import json
import random
from typing import Any

KEYS = ["a", "b", "c"]
_LEAVES = [{"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "null"}, {"type": "object"},
           {"type": "array"}, {"enum": ["x", 1, None]}, {"const": "x"}, {}, True, False, {"minimum": 2},
           {"maxLength": 1}, {"type": "string", "pattern": "^[xy]*$"}, {"format": "uuid"}, {"not": {"enum": ["x", 1]}},
           {"$ref": "#/$defs/e"}]


def _schema(rng: random.Random, depth: int) -> Any:
    if depth <= 0 or rng.random() < 0.25:
        return rng.choice(_LEAVES)
    node: dict[str, Any] = {}
    for keyword in rng.sample(list(_KEYWORDS), rng.randint(1, 4)):
        node.update(_KEYWORDS[keyword](rng, depth - 1))
    return node


_KEYWORDS = {
    "type": lambda rng, d: {"type": rng.choice(["object", "string", "integer", ["object", "null"], ["integer", "string"]])},
    "enum": lambda rng, d: {"enum": rng.sample(["x", "y", 1, 2, None, {"a": 1}, [1]], rng.randint(1, 4))},
    "const": lambda rng, d: {"const": rng.choice(["x", 1, {"a": 1}])},
    "properties": lambda rng, d: {"properties": {k: _schema(rng, d) for k in rng.sample(KEYS, rng.randint(1, 3))}},
    "required": lambda rng, d: {"required": rng.sample(KEYS, rng.randint(1, 2))},
    "additionalProperties": lambda rng, d: {"additionalProperties": rng.choice([False, True, {"type": "integer"}])},
    "patternProperties": lambda rng, d: {"patternProperties": {"^a": _schema(rng, d)}},
    "allOf": lambda rng, d: {"allOf": [_schema(rng, d) for _ in range(rng.randint(1, 3))]},
    "anyOf": lambda rng, d: {"anyOf": [_schema(rng, d) for _ in range(rng.randint(1, 3))]},
    "oneOf": lambda rng, d: {"oneOf": [_schema(rng, d) for _ in range(rng.randint(1, 3))]},
    "not": lambda rng, d: {"not": _schema(rng, d)},
    "bounds": lambda rng, d: {rng.choice(["minimum", "maximum", "minLength", "minItems", "minProperties",
                                          "maxProperties"]): rng.randint(0, 3)},
    "multipleOf": lambda rng, d: {"multipleOf": rng.choice([1, 2, 0.5])},
    "items": lambda rng, d: {"items": _schema(rng, d)},
    "dependentRequired": lambda rng, d: {"dependentRequired": {rng.choice(KEYS): rng.sample(KEYS, 1)}},
    "dependentSchemas": lambda rng, d: {"dependentSchemas": {rng.choice(KEYS): _schema(rng, d)}},
    "if": lambda rng, d: {"if": rng.choice([{"properties": {"a": {"const": "x"}}}, {"required": ["a"]}]),
                          "then": _schema(rng, d), "else": _schema(rng, d)},
    "propertyNames": lambda rng, d: {"propertyNames": rng.choice([{"type": "string"}, {"pattern": "^a"},
                                                                   {"pattern": "^[ab]+$", "maxLength": 1}])},
    "unevaluatedProperties": lambda rng, d: {"unevaluatedProperties": rng.choice([False, {"type": "integer"}])},
    "$ref": lambda rng, d: {"$ref": "#/$defs/e"},
    "uniqueItems": lambda rng, d: {"type": "array", "uniqueItems": True, "maxItems": 4, "items": rng.choice([
        {"type": "string"}, {"type": "integer"}, {"type": "number", "minimum": 0}, {"type": "string", "maxLength": 1},
        {"enum": ["x", "y"]}])},
}


def random_instance(rng: random.Random, depth: int = 2):
    pick = rng.random()
    if depth <= 0 or pick < 0.4:
        return rng.choice(["x", "y", "", "xy", 0, 1, 2, 3, 1.5, None, True, "123e4567-e89b-12d3-a456-426614174000"])
    if pick < 0.8:
        return {k: random_instance(rng, depth - 1) for k in rng.sample([*KEYS, "z"], rng.randint(0, 3))}
    return [random_instance(rng, depth - 1) for _ in range(rng.randint(0, 3))]




def random_schema(rng: random.Random) -> dict[str, Any]:
    while not isinstance(schema := json.loads(json.dumps(_schema(rng, 3))), dict):  # a copy: leaves are shared
        pass
    schema["$defs"] = {"e": {"type": "object", "properties": {"a": rng.choice(_LEAVES[:-1])},
                             "additionalProperties": rng.choice([True, False])}}
    if rng.random() < 0.5:
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def valid(schema: Any, instance: Any) -> bool:
    import jsonschema  # a test dependency, imported where it is used

    validator = jsonschema.validators.validator_for(schema)
    return validator(schema, format_checker=validator.FORMAT_CHECKER).is_valid(instance)
