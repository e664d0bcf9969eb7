"""JSON Schema keywords the grammar engines do not take, rewritten into equal schemas in keywords they do.

Each rewrite is exact (an instance is valid under the rewritten schema exactly when it is valid under the
original, formats being asserted) or is not made, leaving the keyword for the engine to refuse by name. One
rewrite can open the way to another, so they are made over and over until none applies:

- `not: {}` (and `not: true`) allows nothing: the schema becomes `false`; so does `not: {required: [...]}` of
  keys the schema requires itself, a required key whose property schema is `false`, and a `oneOf` of equal
  branches.
- `not: {required: [k]}` says `k` is absent: `properties: {k: false}`.
- `dependentRequired`, `dependentSchemas` and draft-07's `dependencies` ("if `a` is present, so are `b`, `c`",
  "if `a` is present, the object meets S"), over at most MAX_DEPENDENCIES properties, become an `anyOf` of the
  ways to satisfy them: each property either present with what it needs, or absent.
- `if`/`then`/`else` whose `if` tests one property against listed values (`properties: {k: {enum: [...]}}`,
  perhaps with `required: [k]`), on an object schema that lists that property's values itself, becomes an
  `anyOf`: the values the test passes with `then`, the others with `else`, an absent `k` with `then` (with
  `else` if the test requires `k`).
- `allOf` is merged into its schema (`plugd.schema_rewrites.merge`) where the parts' keywords combine exactly:
  `required` lists joined, `properties` and schema-form `items` met, `type`s and `enum`s intersected, the
  tighter of two bounds; not keywords that read one another (`additionalProperties` and `properties`, `items`
  and `prefixItems`, ...), nor a part that is a `$ref` beyond a local definition. In 2019-09 and later, a
  `$ref` beside other keywords is one more part.
- The other keywords of a schema with an `anyOf` or a `oneOf` go into each branch, where those merges are exact
  as above (A and (B or C) is (A and B) or (A and C)), for engines that read a combinator's branches alone.
- Keywords beside a `const` or `enum` that can be decided value by value (`type`, `not` of such keywords,
  lengths, bounds, ...) are applied to the listed values and dropped.
- `minProperties` that the `required` keys meet says nothing more; a required key `properties` does not name
  is named there with the additionalProperties schema that judges it.
- `unevaluatedProperties` beside a subschema applied in place that has additionalProperties (which evaluates
  every property) says nothing; with no subschema applied in place, it is additionalProperties. Where no
  unevaluatedProperties is left, `additionalProperties: true` says nothing either.
- `type: number` with a whole-number `multipleOf` is `type: integer` (and `multipleOf: 1` says nothing more);
  bounded on both sides, with at most MAX_LISTED_MULTIPLES multiples in range, it is the `enum` of them.
- A `oneOf` of several branches that speak only of strings (`format`, `pattern`, lengths) allows strings only:
  any other value meets them all.
- A `oneOf` of closed objects (`additionalProperties: false`) naming different properties, where {} is all
  two branches can share, is the `anyOf` of the branches with `minProperties: 1` added where several allow {}.
- A `oneOf` whose branches are provably disjoint (`plugd.schema_rewrites.disjoint`: their types differ, one
  requires a key the other forbids, both require a key whose allowed `const`/`enum` values differ, or their
  strings cannot start with the same character) is the `anyOf` of the same branches.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable
from typing import Any

from plugd.json_schema import subschemas, transformed
from plugd.schema_rewrites.disjoint import pairwise_disjoint, without_shared_empty_object
from plugd.schema_rewrites.merge import (
    ANNOTATIONS,
    both,
    canonical,
    is_number,
    listed,
    merged,
    resolved,
    types,
    with_listing_applied,
)

MAX_DEPENDENCIES = 3
MAX_LISTED_MULTIPLES = 256
MAX_DISTRIBUTED = 16
MAX_ROUNDS = 8
MAX_GROWTH = 8  # times the schema's JSON length that rewriting may reach
# What stays on a schema whose other keywords go into its branches: annotations, and what sets where $refs lead.
_STAYING = ANNOTATIONS | {"$schema", "$id", "id", "definitions", "$defs"}
# Keywords that apply a subschema to the instance itself, whose annotations unevaluatedProperties reads.
_IN_PLACE = frozenset({"allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref", "$dynamicRef",
                       "dependentSchemas", "dependencies"})
# Dialects in which keywords beside a $ref apply as well (before 2019-09 they are ignored).
_REF_WITH_SIBLINGS = ("https://json-schema.org/draft/2019-09/", "https://json-schema.org/draft/2020-12/")
# A pattern that is one character class (or class escape, or plain character), repeated, for the whole string.
_REPEATED_CLASS = re.compile(r"^\^(\[(?:[^\]\\]|\\.)+\]|\\[wdsWDS]|[A-Za-z0-9_])([+*])\$$")
# Keywords that say nothing about a value that is not a string.
_STRING_ONLY = frozenset({"format", "pattern", "minLength", "maxLength", "contentEncoding", "contentMediaType"})


def rewritten(schema: Any, false_schemas: bool = True) -> Any:
    """`schema` with every exact rewrite above made (a new object; `schema` is left as it is). An engine that
    does not take `false` as a subschema passes `false_schemas=False`, and gets none of the rewrites that would
    write one (the `not`, conditional and dependency ones), so that it refuses the keywords the schema's author
    wrote. A rewrite can open the way to another (a merge brings keywords together), so they are made until
    none applies."""
    if not isinstance(schema, dict):
        return schema
    schema = transformed(schema, lambda node: _unevaluated_settled(node, schema))
    if any(node.keys() & {"unevaluatedProperties", "unevaluatedItems"} for _, node in subschemas(schema)):
        return schema  # the rewrites move what others evaluate, which these read; engines refuse them anyway
    schema = transformed(schema, _without_vacuous_additional)  # it told unevaluatedProperties what it saw
    largest = MAX_GROWTH * len(json.dumps(schema))
    for _ in range(MAX_ROUNDS):
        again = transformed(schema, lambda node, root=schema: _rewrite(node, root, false_schemas))
        if again == schema or not isinstance(again, dict):
            return again
        if len(json.dumps(again)) > largest:
            return schema  # merging a recursive definition into branches unrolls it a level a round
        schema = again
    return schema


def _rewrite(node: dict[str, Any], root: dict[str, Any], false_schemas: bool) -> dict[str, Any] | bool:
    node = _ref_as_part(node, root)
    if isinstance(node.get("allOf"), list) and (one := _all_of_merged(node, root)) is not None:
        if one is False:
            return False
        node = one
    if (node := with_listing_applied(node)) is False:
        return False
    _integer_multiples(node)
    _implied_min_properties(node)
    _required_keys_declared(node)
    _property_names_as_pattern(node, root)
    _typed_by_one_of(node)
    if false_schemas:
        if node.get("not") in ({}, True) or _requires_a_forbidden_key(node) or _negates_its_required(node):
            return False
        _absence_from_not(node)
        _conditional_as_branches(node)
        _dependencies_as_branches(node)
    if (distributed := _distributed(node, root)) is not None:
        if distributed is False:
            return False
        node = distributed
    if isinstance(node.get("oneOf"), list) and "anyOf" not in node:
        if len(node["oneOf"]) > 1 and all(branch == node["oneOf"][0] for branch in node["oneOf"]):
            return False  # what one branch allows, they all do: never exactly one
        if pairwise_disjoint(node["oneOf"], root):
            node["anyOf"] = node.pop("oneOf")
        elif (branches := without_shared_empty_object(node["oneOf"], root)) is not None:
            del node["oneOf"]
            node["anyOf"] = branches
    return node


def _unevaluated_settled(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """unevaluatedProperties sees the properties every subschema applied in place evaluated: where one of them
    (or `node`) has additionalProperties, that is all of them, and it says nothing; where none applies, it
    means what additionalProperties would."""
    if "unevaluatedProperties" not in node:
        return node
    if _has_additional(node, root, depth=0):
        del node["unevaluatedProperties"]
    elif not node.keys() & _IN_PLACE:
        node["additionalProperties"] = node.pop("unevaluatedProperties")
    return node


def _has_additional(node: Any, root: dict[str, Any], depth: int) -> bool:
    """Whether `node`, or a subschema that always applies with it (allOf, $ref), has additionalProperties."""
    if not isinstance(node, dict) or depth > MAX_ROUNDS:
        return False
    if "additionalProperties" in node:
        return True
    applied = [*node.get("allOf", [])] if isinstance(node.get("allOf"), list) else []
    if "$ref" in node:
        applied.append({"$ref": node["$ref"]})
    return any(_has_additional(resolved(part, root), root, depth + 1) for part in applied)


def _without_vacuous_additional(node: dict[str, Any]) -> dict[str, Any]:
    if node.get("additionalProperties") in (True, {}):
        del node["additionalProperties"]  # every property meets `true`
    return node


def _ref_as_part(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """In 2019-09 and later, a $ref beside other keywords applies as one more allOf part."""
    rest = {key: value for key, value in node.items() if key not in _STAYING and key != "$ref"}
    if "$ref" not in node or not rest or not str(root.get("$schema", "")).startswith(_REF_WITH_SIBLINGS):
        return node
    return {**{key: value for key, value in node.items() if key in _STAYING},
            "allOf": [{"$ref": node["$ref"]}, rest]}


def _property_names_as_pattern(node: dict[str, Any], root: dict[str, Any]) -> None:
    """`propertyNames` that every string meets says nothing; one that is a pattern and lengths (on an object
    that names no properties) is the one patternProperties key that additionalProperties' schema applies to."""
    if "propertyNames" not in node:
        return
    names = resolved(node["propertyNames"], root)
    if names is True or isinstance(names, dict) and names.keys() <= ANNOTATIONS | {"type"} and names.get(
            "type", "string") == "string":
        del node["propertyNames"]
        return
    if node.get("properties") or node.get("patternProperties") or "unevaluatedProperties" in node or not (
            isinstance(names, dict) and names.get("type", "string") == "string"
            and names.keys() <= ANNOTATIONS | {"type", "pattern", "minLength", "maxLength"}):
        return
    if (pattern := _pattern_with_lengths(names)) is not None:
        node.pop("properties", None)
        node["patternProperties"] = {pattern: node.pop("additionalProperties", {})}
        node["additionalProperties"] = False
        del node["propertyNames"]


def _pattern_with_lengths(names: dict[str, Any]) -> str | None:
    """One anchored pattern for a `pattern` that repeats one character class and the lengths beside it
    (`^[a-z]+$` with maxLength 8 is `^[a-z]{1,8}$`); None where they do not come together so."""
    low, high = names.get("minLength", 0), names.get("maxLength")
    if not isinstance(low, int) or not (high is None or isinstance(high, int) and high >= low):
        return None
    match = _REPEATED_CLASS.match(names.get("pattern", "^[\\s\\S]*$"))
    if match is None:
        return None
    low = max(low, 1 if match[2] == "+" else 0)
    return f"^{match[1]}{{{low},{'' if high is None else high}}}$"


def _implied_min_properties(node: dict[str, Any]) -> None:
    """An object with the keys `required` lists has at least that many."""
    minimum, required = node.get("minProperties"), node.get("required")
    if isinstance(minimum, int) and isinstance(required, list) and minimum <= len(set(map(str, required))):
        del node["minProperties"]


def _required_keys_declared(node: dict[str, Any]) -> None:
    """A required key `properties` does not name is judged by additionalProperties: named, with that schema, it
    is judged the same (engines that read `required` only among `properties` then see it)."""
    required, properties = node.get("required"), node.get("properties", {})
    if (not isinstance(required, list) or not isinstance(properties, dict) or node.keys() & {
            "patternProperties", "unevaluatedProperties"} or all(key in properties for key in required)):
        return
    judge = node.get("additionalProperties", {})
    node["properties"] = {**properties, **{str(key): judge for key in required if key not in properties}}


def _negates_its_required(node: dict[str, Any]) -> bool:
    """`not: {required: [...]}` of keys `node` requires itself fails every value (`required` holds for
    non-objects)."""
    negated, required = _negated_required(node), node.get("required")
    return negated is not None and isinstance(required, list) and set(negated) <= set(required)


def _requires_a_forbidden_key(node: dict[str, Any]) -> bool:
    properties = node.get("properties")
    return (types(node) == {"object"} and isinstance(properties, dict) and isinstance(node.get("required"), list)
            and any(properties.get(key) is False for key in node["required"]))


def _typed_by_one_of(node: dict[str, Any]) -> None:
    """A value that is not a string meets every branch that only speaks of strings: a oneOf of several such
    branches allows strings only."""
    branches = node.get("oneOf")
    if (isinstance(branches, list) and len(branches) > 1 and "type" not in node and listed(node) is None
            and all(branch is True or isinstance(branch, dict) and branch.keys() <= _STRING_ONLY | ANNOTATIONS
                    for branch in branches)):
        node["type"] = "string"


def _all_of_merged(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any] | bool | None:
    """`node` with its allOf branches merged into it; None where the merge would not be exact."""
    parts = [{key: value for key, value in node.items() if key != "allOf"}]
    for branch in (resolved(branch, root) for branch in node["allOf"]):
        if branch is False:
            return False
        if branch is not True:
            if not isinstance(branch, dict) or branch.keys() & {"$id", "id"}:
                return None  # an $id would move the base its $refs resolve against
            parts.append({key: value for key, value in branch.items() if key not in ANNOTATIONS})
    return merged(parts)


def _distributed(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any] | bool | None:
    """`node`'s other keywords merged into each branch of its anyOf or oneOf (A and (B or C) is (A and B) or
    (A and C); exactly one of B, C given A is exactly one of A and B, A and C); None where a merge is not exact."""
    combinators = [key for key in ("anyOf", "oneOf") if key in node]
    if len(combinators) != 1 or not isinstance(node[combinators[0]], list) or len(node[combinators[0]]) > MAX_DISTRIBUTED:
        return None
    [combinator] = combinators
    staying = {key: value for key, value in node.items() if key in _STAYING}
    shared = {key: value for key, value in node.items() if key not in _STAYING and key != combinator}
    if not shared:
        return None
    branches = []
    for branch in (resolved(branch, root) for branch in node[combinator]):
        if not isinstance(branch, dict | bool) or isinstance(branch, dict) and branch.keys() & {"$id", "id"}:
            return None
        meeting = shared if branch is True else False if branch is False else merged([shared, branch])
        if meeting is None:
            return None
        if meeting is not False:
            branches.append(meeting)
    return {**staying, combinator: branches} if branches else False


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
        if is_number(node.get(inclusive)):
            found.append(rounding(node[inclusive]))
        if is_number(node.get(exclusive)):
            value = node[exclusive]
            found.append(rounding(value) + past if float(value).is_integer() else rounding(value))
        return (max if past > 0 else min)(found) if found else None
    return (bound("minimum", "exclusiveMinimum", math.ceil, 1), bound("maximum", "exclusiveMaximum", math.floor, -1))


def _absence_from_not(node: dict[str, Any]) -> None:
    negated = _negated_required(node)  # `required` holds for any non-object, so the `not` refuses non-objects too
    if (negated is not None and len(negated) == 1 and negated[0] not in node.get("required", [])
            and types(node) == {"object"}):
        node["properties"] = {**node.get("properties", {}), negated[0]: False}
        del node["not"]


def _negated_required(node: dict[str, Any]) -> list[Any] | None:
    """The keys of a `not: {required: [...]}` (beside properties that allow anything); None for any other `not`."""
    negated = node.get("not")
    if not isinstance(negated, dict) or not all(schema in ({}, True) for schema in negated.get("properties", {}).values()):
        return None
    rest = {key: value for key, value in negated.items() if key != "properties"}
    return rest["required"] if rest.keys() == {"required"} and isinstance(rest["required"], list) else None


def _conditional_as_branches(node: dict[str, Any]) -> None:
    test = _value_test(node.get("if"))
    if test is None or "anyOf" in node or types(node) != {"object"}:
        return
    key, tested, key_required = test
    domain = listed(node.get("properties", {}).get(key))
    if domain is None:
        return  # what fails the test could not be written without `not`
    then, otherwise = node.get("then", True), node.get("else", True)
    cases = [(then, [v for v in domain if canonical(v) in tested]),
             (otherwise, [v for v in domain if canonical(v) not in tested])]
    branches = [both(case, {"properties": {key: {"enum": values}}, "required": [key]})
                for case, values in cases if values]
    # Where the key is absent, the test holds unless it requires the key.
    branches.append(both(otherwise if key_required else then, {"properties": {key: False}}))
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
    if (not isinstance(test, dict) or not test.keys() <= {"const", "enum"} or (values := listed(test)) is None
            or required not in ([], [key])):
        return None
    return key, {canonical(v) for v in values}, required == [key]


def _dependencies_as_branches(node: dict[str, Any]) -> None:
    found = {key: node[key] for key in ("dependentRequired", "dependentSchemas", "dependencies")
             if isinstance(node.get(key), dict)}
    needs: dict[str, tuple[set[str], list[Any]]] = {}
    for dependencies in found.values():
        for name, need in dependencies.items():
            required, schemas = needs.setdefault(name, (set(), []))
            if isinstance(need, list):
                required.update(need)
            elif isinstance(need, dict | bool):
                schemas += [] if need in (True, {}) else [need]
            else:
                return
    needs = {name: need for name, need in needs.items() if need != (set(), [])}
    if not found or len(needs) > MAX_DEPENDENCIES or "anyOf" in node:
        return
    if any(schemas for _, schemas in needs.values()) and types(node) != {"object"}:
        return  # a dependency's schema applies to objects only, and the branches to any value
    for key in found:
        del node[key]
    if not needs:
        return
    already = set(node.get("required", []))
    branches = []
    for present in itertools.product((True, False), repeat=len(needs)):
        required, absent, schemas = set(), [], []
        for (name, (wanted, applied)), is_present in zip(needs.items(), present, strict=True):
            if is_present:
                required |= {name, *wanted}
                schemas += applied
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
            if schemas:
                branch["allOf"] = schemas
            branches.append(branch)
    node["anyOf"] = branches


