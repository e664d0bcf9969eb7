"""Proofs that no instance is valid under two branches of a oneOf, so that it means what an anyOf of the same
branches means. A proof that fails says nothing: the oneOf is left for the engine to refuse."""

from __future__ import annotations

import itertools
import re
import string
from typing import Any

from plugd.schema_rewrites.merge import ANNOTATIONS, canonical, listed, resolved, types

# Characters a string valid under a format can start with, for the formats whose first character is narrow: a
# superset of what jsonschema's checks pass (a uuid may be braced or prefixed, as Python's UUID reads it).
_FORMAT_LEADS = {"uuid": frozenset(string.hexdigits + "{u-"), "date": frozenset(string.digits),
                 "date-time": frozenset(string.digits), "time": frozenset(string.digits),
                 "ipv4": frozenset(string.digits)}
# A pattern anchored at its start by one literal character, which nothing makes optional.
_ANCHORED_LITERAL = re.compile(r"^\^(?:([^\\.^$|?*+()\[\]{}])|\\([^A-Za-z0-9]))(?![?*{])")


def pairwise_disjoint(branches: list[Any], root: dict[str, Any]) -> bool:
    shapes = [resolved(branch, root) for branch in branches]
    return all(_disjoint(a, b) for a, b in itertools.combinations(shapes, 2))


def without_shared_empty_object(branches: list[Any], root: dict[str, Any]) -> list[Any] | None:
    """Where every two branches are disjoint or closed objects naming different properties (so that {} is all
    they share), the branches without {} where several allow it; None where that is not so."""
    shapes = [resolved(branch, root) for branch in branches]
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
    if (not isinstance(shape, dict) or types(shape) != {"object"} or shape.get("additionalProperties") is not False
            or shape.get("patternProperties") or "$ref" in shape or not isinstance(shape.get("properties", {}), dict)):
        return None
    return {name for name, schema in shape.get("properties", {}).items() if schema is not False}


def _allows_the_empty_object(shape: Any) -> bool:
    """Whether {} is valid under `shape`, known for certain (a shape with other keywords than these is not)."""
    if not isinstance(shape, dict) or not shape.keys() <= ANNOTATIONS | {
            "type", "properties", "additionalProperties", "required", "minProperties", "maxProperties"}:
        return False
    return types(shape) == {"object"} and not shape.get("required") and shape.get("minProperties", 0) == 0


def _disjoint(a: Any, b: Any) -> bool:
    if a is False or b is False:
        return True
    if not (isinstance(a, dict) and isinstance(b, dict)) or "$ref" in a or "$ref" in b:
        return False  # beside a $ref, other keywords may not apply (drafts up to 7)
    if not types(a) & types(b):
        return True
    if types(a) == types(b) == {"object"}:
        return _object_disjoint(a, b) or _object_disjoint(b, a)
    if types(a) == types(b) == {"string"}:
        leads = [_leading_characters(shape) for shape in (a, b)]
        return None not in leads and not leads[0] & leads[1]
    return False


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
    values = listed(schema.get("properties", {}).get(key))
    return None if values is None else {canonical(v) for v in values}


def _leading_characters(shape: dict[str, Any]) -> frozenset[str] | None:
    """The characters a string valid under `shape` can start with, where its keywords narrow them (and where
    they rule out the empty string, which starts with none); None where they do not."""
    found = []
    if (values := listed(shape)) is not None:
        strings = [value for value in values if isinstance(value, str)]
        if "" in strings:
            return None
        found.append(frozenset(value[0] for value in strings))
    if isinstance(shape.get("pattern"), str) and "|" not in shape["pattern"]:
        if match := _ANCHORED_LITERAL.match(shape["pattern"]):
            found.append(frozenset(match[1] or match[2]))
    if shape.get("format") in _FORMAT_LEADS:
        found.append(_FORMAT_LEADS[shape["format"]])
    return frozenset.intersection(*found) if found else None
