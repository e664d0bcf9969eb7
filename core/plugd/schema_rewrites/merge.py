"""One schema for what several schemas all allow (an allOf), written only where that is exact; and the values a
schema that lists them (`const`, `enum`) still allows once the keywords beside the list are applied to it."""

from __future__ import annotations

import json
import math
import re
from typing import Any

ALL_TYPES = frozenset({"null", "boolean", "number", "string", "array", "object"})
# Keywords that only annotate: a merge drops a branch's.
ANNOTATIONS = frozenset({"title", "description", "$comment", "default", "examples", "deprecated", "readOnly",
                         "writeOnly"})
# Keywords whose meaning depends on the property names beside them in the same schema.
JUDGE_BY_NAMES = frozenset({"additionalProperties", "patternProperties", "unevaluatedProperties", "propertyNames"})
# Keywords that read one another within a schema object: a merge takes each group from one part only (two
# schema-form `items` excepted: every item meeting A and every item meeting B is every item meeting both).
_READ_TOGETHER = (frozenset({"items", "prefixItems", "additionalItems", "unevaluatedItems"}),
                  frozenset({"contains", "minContains", "maxContains"}), frozenset({"if", "then", "else"}))
_LOWER_BOUNDS = frozenset({"minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum"})
_UPPER_BOUNDS = frozenset({"maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum"})
# What `holds` decides for a single value.
_DECIDABLE = frozenset({"type", "enum", "const", "not", "minLength", "maxLength", "minimum", "maximum",
                        "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "minProperties",
                        "maxProperties", "required"})
LOCAL_REF = re.compile(r"^#/(definitions|\$defs)/([^/]+)$")
_NOTHING = object()  # a merge of keyword values that no instance can meet


def merged(parts: list[dict[str, Any]]) -> dict[str, Any] | bool | None:
    """One schema that allows what every part allows (False: nothing does), or None where this merge would not
    be exact."""
    if any("$ref" in part for part in parts):
        return None  # beside a $ref, other keywords may not apply (drafts up to 7)
    # additionalProperties and its kin judge names by the `properties` beside them: the names others bring in
    # must be ones the judging part declares already.
    judges = [part for part in parts if part.keys() & JUDGE_BY_NAMES]
    if len(judges) > 1 or judges and any(
            not isinstance(part.get("properties", {}), dict)
            or not part.get("properties", {}).keys() <= judges[0].get("properties", {}).keys()
            for part in parts if part is not judges[0]):
        return None
    for together in _READ_TOGETHER:
        holders = [part for part in parts if part.keys() & together]
        if len(holders) > 1 and not all(part.keys() & together == {"items"} and isinstance(part["items"], dict | bool)
                                        for part in holders):
            return None
    result: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if key not in result or result[key] == value:
                result[key] = value
            elif (combined := _combined(key, result[key], value)) is None:
                return None
            elif combined is _NOTHING:
                return False
            else:
                result[key] = combined
    return result


def both(a: Any, b: Any) -> Any:
    """One schema for what `a` and `b` both allow; None where it is not at hand."""
    if a is False or b is False:
        return False
    if a is True or a == b:
        return b
    if b is True:
        return a
    return merged([a, b]) if isinstance(a, dict) and isinstance(b, dict) else None


def _combined(key: str, a: Any, b: Any) -> Any:
    """The value of `key` in a schema that means both `a` and `b` as values of it; None where there is none."""
    if key == "required" and isinstance(a, list) and isinstance(b, list):
        return list(dict.fromkeys([*a, *b]))
    if key == "properties" and isinstance(a, dict) and isinstance(b, dict):
        properties = dict(a)
        for name, schema in b.items():
            if (meeting := both(properties[name], schema) if name in properties else schema) is None:
                return None
            properties[name] = meeting
        return properties
    if key == "items" and isinstance(a, dict | bool) and isinstance(b, dict | bool):
        return both(a, b)
    if key == "allOf" and isinstance(a, list) and isinstance(b, list):
        return [*a, *b]
    if key == "type" and (types := _type_names(a)) is not None and (other := _type_names(b)) is not None:
        common = (types & other) | {"integer" for x, y in ((types, other), (other, types))
                                    if "integer" in x and "number" in y}
        return _NOTHING if not common else next(iter(common)) if len(common) == 1 else sorted(common)
    if key == "enum" and isinstance(a, list) and isinstance(b, list):
        allowed = {canonical(value) for value in b}
        return [value for value in a if canonical(value) in allowed] or _NOTHING
    if key in _LOWER_BOUNDS | _UPPER_BOUNDS and is_number(a) and is_number(b):
        return max(a, b) if key in _LOWER_BOUNDS else min(a, b)
    return None


def _type_names(value: Any) -> set[str] | None:
    names = [value] if isinstance(value, str) else value
    return set(names) if isinstance(names, list) and all(isinstance(name, str) for name in names) else None


def with_listing_applied(node: dict[str, Any]) -> dict[str, Any] | bool:
    """`node` with each keyword beside its `const` or `enum` that can be decided value by value applied to the
    listed values and dropped (False where no value is left)."""
    values = listed(node)
    if values is None:
        return node
    decided = []
    for key in node.keys() & _DECIDABLE:
        verdicts = [holds({key: node[key]}, value) for value in values]
        if None not in verdicts:
            values = [value for value, verdict in zip(values, verdicts) if verdict]
            decided.append(key)
    if not values:
        return False
    if decided == ["const"] or decided == ["enum"] or not decided:
        return node
    node = {key: value for key, value in node.items() if key not in decided and key not in ("const", "enum")}
    node["enum"] = values
    return node


def holds(schema: Any, value: Any) -> bool | None:
    """Whether `value` is valid under `schema`, where that depends only on keywords in _DECIDABLE; None where it
    does not."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict) or not schema.keys() <= _DECIDABLE | ANNOTATIONS:
        return None
    verdicts = [_keyword_holds(key, argument, value) for key, argument in schema.items() if key in _DECIDABLE]
    return None if None in verdicts else all(verdicts)


def _keyword_holds(key: str, argument: Any, value: Any) -> bool | None:
    if key == "not":
        verdict = holds(argument, value)
        return None if verdict is None else not verdict
    if key in ("enum", "const"):
        options = [argument] if key == "const" else argument
        return canonical(value) in {canonical(option) for option in options} if isinstance(options, list) else None
    if key == "type":
        names = _type_names(argument)
        verdicts = [_is_of_type(value, name) for name in names or ()]
        return None if names is None or None in verdicts else any(verdicts)
    if key == "required":
        return (set(argument) <= value.keys() if isinstance(value, dict) else True) if isinstance(argument, list) else None
    if not is_number(argument):
        return None
    measured = {"Length": (str, len), "Items": (list, len), "Properties": (dict, len)}
    for suffix, (kind, size) in measured.items():
        if key.endswith(suffix):
            if not isinstance(value, kind):
                return True
            return size(value) >= argument if key.startswith("min") else size(value) <= argument
    if not is_number(value):
        return True
    return {"minimum": value >= argument, "maximum": value <= argument, "exclusiveMinimum": value > argument,
            "exclusiveMaximum": value < argument}[key]


def _is_of_type(value: Any, name: str) -> bool | None:
    if name == "integer":
        if isinstance(value, float) and value.is_integer():
            return None  # an integer from draft 6 on, not in draft 4
        return isinstance(value, int) and not isinstance(value, bool)
    kinds = {"null": type(None), "boolean": bool, "string": str, "array": list, "object": dict}
    if name == "number":
        return is_number(value)
    return isinstance(value, kinds[name]) if name in kinds else None


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def types(schema: dict[str, Any]) -> frozenset[str]:
    """The JSON types an instance of `schema` can have, as far as its own keywords say."""
    values = listed(schema)
    if values is not None:
        return frozenset(map(_type_of, values))
    if (named := _type_names(schema.get("type"))) is not None:
        return frozenset("number" if name == "integer" else name for name in named)
    return ALL_TYPES


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {int: "number", float: "number", str: "string", list: "array", dict: "object"}[type(value)]


def listed(schema: Any) -> list[Any] | None:
    """The values a `const` or `enum` limits `schema` to; None where it lists none."""
    if not isinstance(schema, dict):
        return None
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    return values if isinstance(values, list) else None


def canonical(value: Any) -> str:
    return json.dumps(_numbers_as_floats(value), sort_keys=True)


def _numbers_as_floats(value: Any) -> Any:
    """`value` with every number a float, so that 1 and 1.0, one JSON value, compare equal."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, list):
        return [_numbers_as_floats(item) for item in value]
    if isinstance(value, dict):
        return {key: _numbers_as_floats(item) for key, item in value.items()}
    return value


def resolved(branch: Any, root: dict[str, Any]) -> Any:
    """`branch`, or the local definition it is only a `$ref` to (one level: rewriting again goes further)."""
    if isinstance(branch, dict) and set(branch) - {"$ref", "title", "description"} == set():
        match = LOCAL_REF.match(str(branch.get("$ref", "")))
        if match and isinstance(definitions := root.get(match[1]), dict):
            return definitions.get(match[2].replace("~1", "/").replace("~0", "~"), branch)
    return branch
