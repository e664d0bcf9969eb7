"""JSON Schema keywords the grammar engines do not take, rewritten into equal schemas in keywords they do.

Each rewrite is exact (an instance is valid under the rewritten schema exactly when it is valid under the
original) or is not made, leaving the keyword for the engine to refuse by name:

- `not: {}` (and `not: true`) allows nothing: the schema becomes `false`.
- `not: {required: [k]}` says `k` is absent: `properties: {k: false}`.
- `dependentRequired` and the list form of draft-07's `dependencies` ("if `a` is present, so are `b`, `c`"),
  over at most MAX_DEPENDENCIES properties, become an `anyOf` of the ways to satisfy them: each property
  either present with what it needs, or absent.
- `if`/`then`/`else` whose `if` tests one property against listed values (`properties: {k: {enum: [...]}}`,
  perhaps with `required: [k]`), on an object schema that lists that property's values itself, becomes an
  `anyOf`: the values the test passes with `then`, the others with `else`, an absent `k` with `then` (with
  `else` if the test requires `k`).
- `allOf` is merged into its schema where no two parts bring the same keyword with different values (but
  `required` lists, and `properties` naming different properties) nor keywords that read one another
  (`additionalProperties` and `properties`, `items` and `prefixItems`, ...), and no part is a `$ref` beyond a
  local definition.
- The other keywords of a schema with an `anyOf` or a `oneOf` go into each branch, where those merges are exact
  as above (A and (B or C) is (A and B) or (A and C)), for engines that read a combinator's branches alone.
- `type: number` with a whole-number `multipleOf` is `type: integer` (and `multipleOf: 1` says nothing more);
  bounded on both sides, with at most MAX_LISTED_MULTIPLES multiples in range, it is the `enum` of them.
- A `oneOf` of closed objects (`additionalProperties: false`) naming different properties, where {} is all
  two branches can share, is the `anyOf` of the branches with `minProperties: 1` added where several allow {}.
- A `oneOf` whose branches are provably disjoint (no instance could match two: their types differ, or one
  requires a key the other forbids, or both require a key whose allowed `const`/`enum` values differ) is the
  `anyOf` of the same branches.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable
from typing import Any

from plugd.json_schema import transformed

MAX_DEPENDENCIES = 3
MAX_LISTED_MULTIPLES = 256
MAX_DISTRIBUTED = 16
_ALL_TYPES = frozenset({"null", "boolean", "number", "string", "array", "object"})
# Keywords whose meaning depends on the property names beside them in the same schema.
_JUDGE_BY_NAMES = frozenset({"additionalProperties", "patternProperties", "unevaluatedProperties", "propertyNames"})
# Keywords that only annotate: a merge drops a branch's.
_ANNOTATIONS = frozenset({"title", "description", "$comment", "default", "examples", "deprecated", "readOnly",
                          "writeOnly"})
# Keywords that read one another within a schema object: a merge takes each group from one part only.
_READ_TOGETHER = (frozenset({"items", "prefixItems", "additionalItems", "unevaluatedItems"}),
                  frozenset({"contains", "minContains", "maxContains"}), frozenset({"if", "then", "else"}))
# What stays on a schema whose other keywords go into its branches: annotations, and what sets where $refs lead.
_STAYING = _ANNOTATIONS | {"$schema", "$id", "id", "definitions", "$defs"}
_LOCAL_REF = re.compile(r"^#/(definitions|\$defs)/([^/]+)$")


def rewritten(schema: Any, false_schemas: bool = True) -> Any:
    """`schema` with every exact rewrite above made (a new object; `schema` is left as it is). An engine that
    does not take `false` as a subschema passes `false_schemas=False`, and gets none of the rewrites that would
    write one (the `not`, conditional and dependency ones), so that it refuses the keywords the schema's author wrote."""
    if not isinstance(schema, dict):
        return schema
    return transformed(schema, lambda node: _rewrite(node, schema, false_schemas))


def _rewrite(node: dict[str, Any], root: dict[str, Any], false_schemas: bool) -> dict[str, Any] | bool:
    if isinstance(node.get("allOf"), list) and (merged := _all_of_merged(node, root)) is not None:
        if merged is False:
            return False
        node = merged
    _integer_multiples(node)
    if false_schemas:
        if node.get("not") in ({}, True):
            return False
        _absence_from_not(node)
        _conditional_as_branches(node)
        _dependencies_as_branches(node)
    if (distributed := _distributed(node, root)) is not None:
        if distributed is False:
            return False
        node = distributed
    if isinstance(node.get("oneOf"), list) and "anyOf" not in node:
        if _pairwise_disjoint(node["oneOf"], root):
            node["anyOf"] = node.pop("oneOf")
        elif (branches := _without_shared_empty_object(node["oneOf"], root)) is not None:
            del node["oneOf"]
            node["anyOf"] = branches
    return node


def _all_of_merged(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any] | bool | None:
    """`node` with its allOf branches merged into it; None where the merge would not be exact."""
    parts = [{key: value for key, value in node.items() if key != "allOf"}]
    for branch in (_resolved(branch, root) for branch in node["allOf"]):
        if branch is False:
            return False
        if branch is not True:
            if not isinstance(branch, dict) or branch.keys() & {"$id", "id"}:
                return None  # an $id would move the base its $refs resolve against
            parts.append({key: value for key, value in branch.items() if key not in _ANNOTATIONS})
    return _merged_parts(parts)


def _distributed(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any] | bool | None:
    """`node`'s other keywords merged into each branch of its anyOf or oneOf (A and (B or C) is (A and B) or
    (A and C); exactly one of B, C given A is exactly one of A and B, A and C); None where a merge is not exact."""
    [combinator] = [key for key in ("anyOf", "oneOf") if isinstance(node.get(key), list)] or [None]
    if combinator is None or "anyOf" in node and "oneOf" in node or len(node[combinator]) > MAX_DISTRIBUTED:
        return None
    staying = {key: value for key, value in node.items() if key in _STAYING}
    shared = {key: value for key, value in node.items() if key not in _STAYING and key != combinator}
    if not shared:
        return None
    branches = []
    for branch in (_resolved(branch, root) for branch in node[combinator]):
        if not isinstance(branch, dict | bool) or isinstance(branch, dict) and branch.keys() & {"$id", "id"}:
            return None
        merged = shared if branch is True else False if branch is False else _merged_parts([shared, branch])
        if merged is None:
            return None
        if merged is not False:
            branches.append(merged)
    return {**staying, combinator: branches} if branches else False


def _merged_parts(parts: list[dict[str, Any]]) -> dict[str, Any] | bool | None:
    """One schema that allows what every part allows, or None where this merge would not be exact."""
    if any("$ref" in part for part in parts):
        return None  # beside a $ref, other keywords may not apply (drafts up to 7)
    # additionalProperties and its kin judge names by the `properties` beside them: the names others bring in
    # must be ones the judging part declares already.
    judges = [part for part in parts if part.keys() & _JUDGE_BY_NAMES]
    if len(judges) > 1 or judges and any(
            not isinstance(part.get("properties", {}), dict)
            or not part.get("properties", {}).keys() <= judges[0].get("properties", {}).keys()
            for part in parts if part is not judges[0]):
        return None
    for together in _READ_TOGETHER:
        if len([part for part in parts if part.keys() & together]) > 1:
            return None
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if key not in merged or merged[key] == value:
                merged[key] = value
            elif key == "required" and isinstance(value, list) and isinstance(merged[key], list):
                merged[key] = list(dict.fromkeys([*merged[key], *value]))
            elif key == "properties" and isinstance(value, dict):
                properties = dict(merged[key])
                for name, schema in value.items():
                    if (both := _both(properties[name], schema) if name in properties else schema) is None:
                        return None
                    properties[name] = both
                merged[key] = properties
            else:
                return None
    return merged


def _both(a: Any, b: Any) -> Any:
    """One schema for what `a` and `b` both allow; None where it is not at hand."""
    if a is False or b is False:
        return False
    if a is True or a == b:
        return b
    if b is True:
        return a
    return _merged_parts([a, b]) if isinstance(a, dict) and isinstance(b, dict) else None


def _integer_multiples(node: dict[str, Any]) -> None:
    step = node.get("multipleOf")
    if not (isinstance(step, int | float) and not isinstance(step, bool) and step > 0 and float(step).is_integer()):
        return
    if node.get("type") == "number":
        node["type"] = "integer"  # a multiple of a whole number is a whole number
    if node.get("type") == "integer" and step == 1:
        del node["multipleOf"]  # every integer is a multiple of 1
        return
    low, high = _integer_bounds(node)
    if node.get("type") == "integer" and low is not None and high is not None and low <= high and "enum" not in node:
        step = int(step)
        first = -(-low // step) * step
        if (high - first) // step < MAX_LISTED_MULTIPLES:
            for keyword in ("multipleOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                node.pop(keyword, None)
            node["enum"] = list(range(first, high + 1, step))


def _integer_bounds(node: dict[str, Any]) -> tuple[int | None, int | None]:
    """The least and greatest integers `node`'s bounds allow (None where unbounded or unreadable)."""
    if any(isinstance(node.get(bound), bool) for bound in ("exclusiveMinimum", "exclusiveMaximum")):
        return None, None  # draft-04's flags: left to the engine, which refuses them
    def bound(inclusive: str, exclusive: str, rounding: Callable[[float], int], past: int) -> int | None:
        found = []
        if _is_number(node.get(inclusive)):
            found.append(rounding(node[inclusive]))
        if _is_number(node.get(exclusive)):
            value = node[exclusive]
            found.append(rounding(value) + past if float(value).is_integer() else rounding(value))
        return (max if past > 0 else min)(found) if found else None
    return (bound("minimum", "exclusiveMinimum", math.ceil, 1), bound("maximum", "exclusiveMaximum", math.floor, -1))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _absence_from_not(node: dict[str, Any]) -> None:
    negated = node.get("not")  # `required` holds for any non-object, so the `not` refuses non-objects too
    if (isinstance(negated, dict) and negated.keys() == {"required"} and isinstance(negated["required"], list)
            and len(negated["required"]) == 1 and negated["required"][0] not in node.get("required", [])
            and _types(node) == {"object"}):
        node["properties"] = {**node.get("properties", {}), negated["required"][0]: False}
        del node["not"]


def _conditional_as_branches(node: dict[str, Any]) -> None:
    test = _value_test(node.get("if"))
    if test is None or "anyOf" in node or _types(node) != {"object"}:
        return
    key, tested, key_required = test
    domain = _listed(node.get("properties", {}).get(key))
    if domain is None:
        return  # what fails the test could not be written without `not`
    then, otherwise = node.get("then", True), node.get("else", True)
    cases = [(then, [v for v in domain if _canonical(v) in tested]),
             (otherwise, [v for v in domain if _canonical(v) not in tested])]
    branches = [_both(case, {"properties": {key: {"enum": values}}, "required": [key]})
                for case, values in cases if values]
    # Where the key is absent, the test holds unless it requires the key.
    branches.append(_both(otherwise if key_required else then, {"properties": {key: False}}))
    if None in branches or not (branches := [branch for branch in branches if branch is not False]):
        return
    for keyword in ("if", "then", "else"):
        node.pop(keyword, None)
    node["anyOf"] = branches


def _value_test(condition: Any) -> tuple[str, set[str], bool] | None:
    """(key, the values it passes as canonical JSON, whether it requires the key) for an `if` that tests one
    property against listed values; None for any other `if`."""
    if not isinstance(condition, dict) or not condition.keys() <= {"properties", "required"}:
        return None
    properties, required = condition.get("properties"), condition.get("required", [])
    if not isinstance(properties, dict) or len(properties) != 1:
        return None
    [(key, test)] = properties.items()
    if (not isinstance(test, dict) or not test.keys() <= {"const", "enum"} or (values := _listed(test)) is None
            or required not in ([], [key])):
        return None
    return key, {_canonical(v) for v in values}, required == [key]


def _dependencies_as_branches(node: dict[str, Any]) -> None:
    lists = {key: node[key] for key in ("dependentRequired", "dependencies") if isinstance(node.get(key), dict)}
    if not lists or any(not isinstance(needs, list) for needs in itertools.chain(*(d.values() for d in lists.values()))):
        return  # dependencies on schemas (dependentSchemas' kind) are not rewritten
    needs: dict[str, set[str]] = {}
    for dependencies in lists.values():
        for name, required in dependencies.items():
            needs.setdefault(name, set()).update(required)
    needs = {name: required for name, required in needs.items() if required}
    if len(needs) > MAX_DEPENDENCIES or "anyOf" in node:
        return
    for key in lists:
        del node[key]
    if not needs:
        return
    already = set(node.get("required", []))
    branches = []
    for present in itertools.product((True, False), repeat=len(needs)):
        required, absent = set(), []
        for (name, wanted), is_present in zip(needs.items(), present, strict=True):
            if is_present:
                required |= {name, *wanted}
            elif name in already:
                break  # this way of satisfying the dependencies leaves out a key the schema requires
            else:
                absent.append(name)
        else:
            branch: dict[str, Any] = {}
            if required - already:
                branch["required"] = sorted(required - already)
            if absent:
                branch["properties"] = dict.fromkeys(absent, False)
            branches.append(branch)
    node["anyOf"] = branches


def _pairwise_disjoint(branches: list[Any], root: dict[str, Any]) -> bool:
    shapes = [_resolved(branch, root) for branch in branches]
    return all(_disjoint(a, b) for a, b in itertools.combinations(shapes, 2))


def _without_shared_empty_object(branches: list[Any], root: dict[str, Any]) -> list[Any] | None:
    """Where every two branches are disjoint or closed objects naming different properties (so that {} is all
    they share), the branches without {} where several allow it; None where that is not so."""
    shapes = [_resolved(branch, root) for branch in branches]
    if not all(_disjoint(a, b) or _share_only_the_empty_object(a, b) for a, b in itertools.combinations(shapes, 2)):
        return None
    allowing = [i for i, shape in enumerate(shapes) if _allows_the_empty_object(shape)]
    if len(allowing) < 2:
        return list(branches)
    return [{**shape, "minProperties": 1} if i in allowing else branches[i] for i, shape in enumerate(shapes)]


def _share_only_the_empty_object(a: Any, b: Any) -> bool:
    closed = [_closed_object_names(shape) for shape in (a, b)]
    return None not in closed and not closed[0] & closed[1]


def _closed_object_names(shape: Any) -> set[str] | None:
    """The properties an object valid under `shape` may have, where `shape` admits objects with those only."""
    if (not isinstance(shape, dict) or _types(shape) != {"object"} or shape.get("additionalProperties") is not False
            or shape.get("patternProperties") or "$ref" in shape or not isinstance(shape.get("properties", {}), dict)):
        return None
    return {name for name, schema in shape.get("properties", {}).items() if schema is not False}


def _allows_the_empty_object(shape: Any) -> bool:
    """Whether {} is valid under `shape`, known for certain (a shape with other keywords than these is not)."""
    if not isinstance(shape, dict) or not shape.keys() <= _ANNOTATIONS | {
            "type", "properties", "additionalProperties", "required", "minProperties", "maxProperties"}:
        return False
    return _types(shape) == {"object"} and not shape.get("required") and shape.get("minProperties", 0) == 0


def _resolved(branch: Any, root: dict[str, Any]) -> Any:
    """`branch`, or the local definition it is only a `$ref` to (one level: that is all the proof looks at)."""
    if isinstance(branch, dict) and set(branch) - {"$ref", "title", "description"} == set():
        match = _LOCAL_REF.match(str(branch.get("$ref", "")))
        if match and isinstance(definitions := root.get(match[1]), dict):
            return definitions.get(match[2].replace("~1", "/").replace("~0", "~"), branch)
    return branch


def _disjoint(a: Any, b: Any) -> bool:
    if a is False or b is False:
        return True
    if not (isinstance(a, dict) and isinstance(b, dict)) or "$ref" in a or "$ref" in b:
        return False  # beside a $ref, other keywords may not apply (drafts up to 7)
    if not _types(a) & _types(b):
        return True
    if _types(a) == _types(b) == {"object"}:
        return _object_disjoint(a, b) or _object_disjoint(b, a)
    return False


def _types(schema: dict[str, Any]) -> frozenset[str]:
    """The JSON types an instance of `schema` can have, as far as its own keywords say."""
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(values, list):
        found = frozenset(map(_type_of, values))
    elif isinstance(schema.get("type"), str | list):
        named = [schema["type"]] if isinstance(schema["type"], str) else schema["type"]
        found = frozenset("number" if t == "integer" else t for t in named)
    else:
        return _ALL_TYPES
    return found


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {int: "number", float: "number", str: "string", list: "array", dict: "object"}[type(value)]


def _object_disjoint(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether an object valid under `a` never is under `b`: a key `a` requires is one `b` forbids, or one both
    require with values that cannot agree."""
    for key in a.get("required", []):
        if _forbids(b, key):
            return True
        if key in b.get("required", []):
            allowed_a, allowed_b = _values(a, key), _values(b, key)
            if allowed_a is not None and allowed_b is not None and not allowed_a & allowed_b:
                return True
    return False


def _forbids(schema: dict[str, Any], key: str) -> bool:
    properties = schema.get("properties", {})
    if key in properties:
        return properties[key] is False
    return schema.get("additionalProperties") is False and not schema.get("patternProperties")


def _values(schema: dict[str, Any], key: str) -> set[str] | None:
    """The values `schema` allows at `key`, as canonical JSON; None where it allows more than a listed few."""
    listed = _listed(schema.get("properties", {}).get(key))
    return None if listed is None else {_canonical(v) for v in listed}


def _listed(schema: Any) -> list[Any] | None:
    """The values a `const` or `enum` limits `schema` to; None where it lists none."""
    if not isinstance(schema, dict):
        return None
    listed = [schema["const"]] if "const" in schema else schema.get("enum")
    return listed if isinstance(listed, list) else None


def _canonical(value: Any) -> str:
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
