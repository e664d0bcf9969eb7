"""JSON Schemas as the grammar engines take them: every schema object a schema holds, with its JSON pointer; and
patterns for the formats the engines get wrong or do not know.

Engines' own `date`, `date-time` and `time` grammars (xgrammar's, llguidance's) check only the digits' shapes:
they let a model write 2023-02-31, year 0000 or second 60. `with_format_patterns` swaps those formats for
patterns that allow only real calendar dates (month lengths, leap years), years 0001-9999 and seconds 00-59:
every string they allow is a valid RFC 3339 date or time, which is what the schema asks for.

Neither engine knows `format: regex`. A regular expression's syntax nests, which no pattern can follow to any
depth, so it becomes REGEX_SUBSET: regular expressions built of literal characters, escapes, `.`, character
classes, quantifiers, alternatives and groups nested up to three deep, none of it peculiar to Python. Every
string it allows compiles with Python's `re`, which jsonschema checks the format with (tests/test_regex_format.py
walks the grammar at random to show it); a regex beyond it cannot be written.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

# The formats JSON Schema itself defines (draft 2020-12). Any other format name is an annotation that no
# validator can check, and is accepted as one.
STANDARD_FORMATS = frozenset({
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4", "ipv6",
    "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer",
    "relative-json-pointer", "regex",
})
# Keywords whose value is a schema, a list of schemas, or a map of names to schemas.
_ONE_SCHEMA = ("items", "additionalItems", "additionalProperties", "propertyNames", "contains", "not", "if", "then",
               "else", "unevaluatedItems", "unevaluatedProperties")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "definitions", "$defs", "dependentSchemas", "dependencies")


def subschemas(node: Any, pointer: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object in `node`, with its JSON pointer; data (enum, const, default, examples) is skipped."""
    if not isinstance(node, dict):
        return
    yield pointer, node
    for keyword in _ONE_SCHEMA:
        if isinstance(node.get(keyword), dict):
            yield from subschemas(node[keyword], f"{pointer}/{keyword}")
    for keyword in _SCHEMA_LISTS:
        if isinstance(node.get(keyword), list):
            for i, item in enumerate(node[keyword]):
                yield from subschemas(item, f"{pointer}/{keyword}/{i}")
    for keyword in _SCHEMA_MAPS:
        if isinstance(node.get(keyword), dict):
            for name, item in node[keyword].items():
                yield from subschemas(item, f"{pointer}/{keyword}/{escape(name)}")


def transformed(node: Any, rewrite: Callable[[dict[str, Any]], Any]) -> Any:
    """A copy of `node` in which every schema object is what `rewrite` makes of it, innermost first (`rewrite`
    gets a fresh dict it may change and returns the schema to put in its place)."""
    if not isinstance(node, dict):
        return node
    node = dict(node)
    for keyword in _ONE_SCHEMA:
        if isinstance(node.get(keyword), dict):
            node[keyword] = transformed(node[keyword], rewrite)
    for keyword in _SCHEMA_LISTS:
        if isinstance(node.get(keyword), list):
            node[keyword] = [transformed(item, rewrite) for item in node[keyword]]
    for keyword in _SCHEMA_MAPS:
        if isinstance(node.get(keyword), dict):
            node[keyword] = {name: transformed(item, rewrite) for name, item in node[keyword].items()}
    return rewrite(node)


def escape(name: str) -> str:
    """`name` as one JSON pointer segment."""
    return name.replace("~", "~0").replace("/", "~1")


_YEAR = "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_MONTH_DAY = ("(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
              "|02-(?:0[1-9]|1[0-9]|2[0-8]))")
_LEAP_DAY = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)-02-29"
_DATE = f"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_DAY})"
_TIME = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
PATTERNS = {"date": f"^{_DATE}$", "time": f"^{_TIME}$", "date-time": f"^{_DATE}T{_TIME}$"}
_REGEX_LITERAL = r"""[A-Za-z0-9 !"#%&',\-/:;<=>@_`~]"""
_REGEX_ESCAPE = r"""\\[dDwWsSntr.\\/^$|?*+()\[\]{}\-]"""
# No & or ~ in a class: re warns of && and ~~ there as set operations to come.
_REGEX_CLASS = r"""\[\^?(?:[A-Za-z0-9 !"#%',./:;<=>@_`]|a-z|A-Z|0-9|\\[dDwWsS.\\\-\[\]^])+-?\]"""
_REGEX_QUANTIFIER = r"(?:[?*+]|\{[0-9]{1,3},?\})\??"  # {n,m} is left out: n > m would not compile


def _regex_alternatives(inner: str | None) -> str:
    group = rf"|\((?:\?:)?{inner}\)" if inner else ""
    sequence = rf"(?:(?:{_REGEX_LITERAL}|{_REGEX_ESCAPE}|\.|{_REGEX_CLASS}{group})(?:{_REGEX_QUANTIFIER})?)*"
    return rf"{sequence}(?:\|{sequence})*"


REGEX_SUBSET = rf"^\^?{_regex_alternatives(_regex_alternatives(_regex_alternatives(_regex_alternatives(None))))}\$?$"


def without_annotations(schema: Any) -> Any:
    """A copy of `schema` without the formats JSON Schema does not define, which are annotations only."""
    schema = copy.deepcopy(schema)
    for _, node in subschemas(schema):
        if isinstance(node.get("format"), str) and node["format"] not in STANDARD_FORMATS:
            del node["format"]
    return schema


def with_format_patterns(schema: Any) -> Any:
    """A copy of `schema` in which every date, date-time and time format is the pattern above, and every regex
    format REGEX_SUBSET (where no pattern is beside it)."""
    schema = copy.deepcopy(schema)
    patterns = {**PATTERNS, "regex": REGEX_SUBSET}
    for _, node in subschemas(schema, ""):
        if node.get("format") in patterns and "pattern" not in node:
            node["pattern"] = patterns[node.pop("format")]
    return schema
