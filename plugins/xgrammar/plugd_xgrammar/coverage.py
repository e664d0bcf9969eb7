"""JSON Schema features that xgrammar accepts but silently does not enforce, found by probing it with instances
that break them (tests/test_coverage.py keeps those probes). A schema using one is refused, never served as if
it were enforced.

What xgrammar approximates *with* a warning (oneOf branches it cannot prove disjoint, allOf of several
schemas, regex lookaheads, non-local $refs, multipleOf on numbers, length limits next to a pattern or a
format) is caught from its warnings instead (see `native_log`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from plugd.json_schema import STANDARD_FORMATS, subschemas

# Keywords xgrammar ignores without a word, whatever their value (False: unless the value is a no-op).
IGNORED = {"not": None, "contains": None, "minContains": None, "maxContains": None, "dependencies": None,
           "dependentRequired": None, "dependentSchemas": None, "then": None, "else": None,
           "uniqueItems": False, "unevaluatedProperties": True}
_COMBINATORS = ("anyOf", "oneOf", "allOf")
# Keywords xgrammar reads only where `type` names the type they apply to (it takes an untyped value as any).
_TYPED_KEYWORDS = {
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "string": ("minLength", "maxLength", "pattern"),
    "array": ("minItems", "maxItems"),
    "object": ("minProperties", "maxProperties", "patternProperties"),
}
# Drafts in which keywords beside a $ref are ignored (by the specification, so by xgrammar rightly).
_REF_OVERRIDES_SIBLINGS = re.compile(r"json-schema\.org/(draft-0[3-7]/)")
_VALIDATION = frozenset({
    "type", "enum", "const", "properties", "patternProperties", "additionalProperties", "required", "propertyNames",
    "minProperties", "maxProperties", "items", "prefixItems", "additionalItems", "minItems", "maxItems",
    "uniqueItems", "contains", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minLength", "maxLength", "pattern", "format", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
    "dependentRequired", "dependentSchemas", "dependencies", "unevaluatedProperties", "unevaluatedItems",
})


def unenforced_features(schema: Any, format_enforced: Callable[[str], bool]) -> list[str]:
    """What in `schema` xgrammar would not enforce, each named with where it is ("'not' at /properties/x")."""
    ref_siblings_apply = not (isinstance(schema, dict) and _REF_OVERRIDES_SIBLINGS.search(str(schema.get("$schema"))))
    problems = []
    for pointer, node in subschemas(schema, ""):
        found = (_ignored_keywords(node) + _format_problems(node, format_enforced) + _property_name_problems(node)
                 + _listing_beside_keywords(node)
                 + ([] if pointer.endswith("/propertyNames") else _untyped_keywords(node)))  # names are strings
        if ref_siblings_apply and "$ref" in node and (siblings := sorted(node.keys() & _VALIDATION)):
            found.append(f"keywords beside $ref ({', '.join(siblings)})")
        for combinator in _COMBINATORS:  # xgrammar takes the branches alone, the schema's other keywords unread
            if combinator in node and (siblings := sorted(node.keys() & _VALIDATION - {combinator})):
                found.append(f"keywords beside '{combinator}' ({', '.join(siblings)})")
        problems += [f"{problem} at {pointer or '/'}" for problem in found]
    return problems


def _ignored_keywords(node: dict[str, Any]) -> list[str]:
    found = []
    for keyword, no_op in IGNORED.items():
        if keyword in node and node[keyword] != no_op:
            found.append(f"'{keyword}'")
    for bound in ("exclusiveMinimum", "exclusiveMaximum"):
        if isinstance(node.get(bound), bool):
            found.append(f"'{bound}' as a boolean (draft-04)")
    found += [f"'{bound}' on strings (xgrammar writes control characters raw in them, which is not JSON)"
              for bound in ("minLength", "maxLength") if bound in node and _may_be_string(node)]
    return found


def _listing_beside_keywords(node: dict[str, Any]) -> list[str]:
    """xgrammar takes `enum` and `const` as the whole schema, the keywords beside them unread (plugd's rewrites
    apply those they can to the listed values first)."""
    listing = [keyword for keyword in ("enum", "const") if keyword in node]
    beside = sorted(node.keys() & _VALIDATION - {"enum", "const"} - ({"format"} if node.get("format") not in
                                                                       STANDARD_FORMATS else set()))
    if listing and beside:
        return [f"keywords beside '{listing[0]}' ({', '.join(beside)})"]
    return []


def _may_be_string(node: dict[str, Any]) -> bool:
    types = node.get("type")
    return types is None or types == "string" or isinstance(types, list) and "string" in types


def _untyped_keywords(node: dict[str, Any]) -> list[str]:
    if "type" in node or "enum" in node or "const" in node:
        return []
    return [f"'{keyword}' without type '{kind}'" for kind, keywords in _TYPED_KEYWORDS.items()
            for keyword in keywords if keyword in node]


def _format_problems(node: dict[str, Any], format_enforced: Callable[[str], bool]) -> list[str]:
    fmt = node.get("format")
    if fmt not in STANDARD_FORMATS:
        return []
    types = node.get("type")
    if not format_enforced(fmt):
        return [f"format {fmt!r}"]
    if "string" not in (types if isinstance(types, list) else [types]):
        return [f"format {fmt!r} without type 'string'"]
    if "pattern" in node:
        return [f"format {fmt!r} together with a pattern"]
    return []


def _property_name_problems(node: dict[str, Any]) -> list[str]:
    """xgrammar gives a property one schema: `properties` or else a matching pattern, never both."""
    properties, patterns = node.get("properties") or {}, node.get("patternProperties") or {}
    found = [f"property {name!r} matching patternProperties {pattern!r}"
             for name in properties for pattern in patterns if _matches(pattern, name)]
    if "propertyNames" in node and (properties or patterns or node.get("additionalProperties", True) is not True):
        found.append("'propertyNames' together with properties, patternProperties or additionalProperties")
    return found


def _matches(pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return True  # a pattern Python cannot read might match: assume it does
