"""plugd.json_uniqueness through both engines' matchers: a key never repeats in its object, nor a string or number
item in a uniqueItems array, whichever tokens write it: one byte at a time, a token that closes the string or
number (looked up), or one that opens and closes them or holds escapes (followed byte by byte)."""

from __future__ import annotations

import random

import jsonschema
import pytest

from plugd.json_uniqueness import ITEMS, RepeatOnly, unique_arrays
from plugd.runner_api import GrammarRefused, GrammarVocabulary
from plugd.testing.grammar import allowed_tokens, parsed
from plugd_llguidance.engine import LLGuidanceEngine
from plugd_xgrammar.engine import XGrammarEngine

# Every byte, then tokens of several bytes that hold quotes, as a real vocabulary has them.
WORDS = [b'a"', b'b"', b'ab"', b'"a"', b'"b"', b'", "', b'": ', b'"a": ', b'\\"', b'\\u000a"', b'""', b'"}', b', "',
         b'ab', b'ba', b'"]', b'1,', b'1]', b', 1', b', 1]', b'12', b'0,', b'.0,',
         b'", "", "']
TOKENS = [bytes([b]) for b in range(256)] + WORDS
STOP = len(TOKENS)
VOCABULARY = GrammarVocabulary([*TOKENS, b""], frozenset({STOP}))
OPEN_KEYS = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9},
             "minProperties": 3, "maxProperties": 5}
UNIQUE_NUMBERS = {"type": "array", "items": {"type": "number", "minimum": 0}, "minItems": 3, "maxItems": 6,
                  "uniqueItems": True}
UNIQUE_WORDS = {"type": "object", "properties": {"tags": {
    "type": "array", "items": {"type": "string", "pattern": "^[ab]+$"}, "minItems": 3, "maxItems": 5,
    "uniqueItems": True}}, "required": ["tags"], "additionalProperties": False}


@pytest.fixture(scope="module", params=[LLGuidanceEngine, XGrammarEngine], ids=["llguidance", "xgrammar"])
def engine(request):
    return request.param(VOCABULARY)


def allowed(matcher) -> list[int]:
    return allowed_tokens(matcher, VOCABULARY.width)


def written(matcher, tokens: bytes | list[int]) -> None:
    for token in tokens:
        assert token in allowed(matcher) and matcher.accept(token), tokens


def walk(matcher, rng: random.Random) -> bytes | None:
    """A random output, the tokens of several bytes drawn as often as single bytes."""
    out = b""
    for _ in range(300):
        choices = allowed(matcher)
        if STOP in choices:
            return out
        words = [t for t in choices if t > 255]
        token = rng.choice(words if words and rng.random() < 0.5 else choices)
        assert matcher.accept(token)
        out += TOKENS[token]
    return None


@pytest.mark.parametrize("schema", [OPEN_KEYS, UNIQUE_WORDS, UNIQUE_NUMBERS], ids=["keys", "strings", "numbers"])
def test_random_outputs_never_repeat(engine, schema):
    compiled, rng, outputs = engine.compile("json_schema", schema), random.Random(3), []
    for _ in range(120):
        try:
            out = walk(compiled.matcher(), rng)
        except RepeatOnly:
            continue  # the walk wrote itself into a corner the schema leaves no way out of
        if out is not None:
            value = parsed(out)
            jsonschema.validate(value, schema)
            outputs.append(out)
    assert len(outputs) > 60


def test_a_key_written_already_cannot_be_closed(engine):
    matcher = engine.compile("json_schema", OPEN_KEYS).matcher()
    written(matcher, b'{"a": 1, "')
    assert TOKENS.index(b'a"') not in allowed(matcher)  # looked up: it would close "a"
    assert TOKENS.index(b'ab"') in allowed(matcher)
    written(matcher, b"a")
    assert ord('"') not in allowed(matcher) and ord("b") in allowed(matcher)


def test_a_key_is_the_same_key_however_it_is_escaped(engine):
    matcher = engine.compile("json_schema", OPEN_KEYS).matcher()
    written(matcher, b'{"a": 1, ')
    assert TOKENS.index(b'"a"') not in allowed(matcher)  # opens and closes it: followed
    written(matcher, b'"\\n": 2, "')
    assert TOKENS.index(b'\\u000a"') not in allowed(matcher)  # "\n" again, escaped otherwise
    written(matcher, b"\\u000a")
    assert ord('"') not in allowed(matcher)  # the text so far holds an escape: each token followed


def test_a_token_that_writes_an_item_twice_itself_is_taken_out(engine):
    matcher = engine.compile("json_schema", ARRAY).matcher()
    written(matcher, b'["')
    assert TOKENS.index(b'", "", "') not in allowed(matcher)  # "" and "" again, in the first items of the array
    written(matcher, b"a")
    assert TOKENS.index(b'", "", "') in allowed(matcher)


def test_keys_of_other_objects_do_not_count(engine):
    schema = {"type": "array", "items": {"type": "object", "additionalProperties": {"type": "integer"}}}
    matcher = engine.compile("json_schema", schema).matcher()
    written(matcher, b'[{"a": 1}, {"a": 2, "b": 3}, {"')
    assert TOKENS.index(b'a"') in allowed(matcher)


def test_where_only_a_repeat_is_left_the_matcher_says_so(engine):
    schema = {"type": "object", "patternProperties": {"^a$": {"type": "integer"}}, "additionalProperties": False}
    matcher = engine.compile("json_schema", schema).matcher()
    written(matcher, b'{"')
    written(matcher, [TOKENS.index(b'a"')])  # the grammar's only token here: it forces the text
    written(matcher, b": 1,")
    with pytest.raises(RepeatOnly):  # as soon as the grammar's only way on is the key again
        written(matcher, b' "a')
        allowed(matcher)


def test_unique_strings_are_kept_only_in_their_array(engine):
    schema = {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "notes": {"type": "array", "items": {"type": "string"}}}}
    matcher = engine.compile("json_schema", schema).matcher()
    written(matcher, b'{"tags": ["ab", "')
    assert TOKENS.index(b'ab"') not in allowed(matcher) and TOKENS.index(b'ba') in allowed(matcher)
    matcher = engine.compile("json_schema", schema).matcher()
    written(matcher, b'{"notes": ["ab", "')
    assert TOKENS.index(b'ab"') in allowed(matcher)


def test_a_number_written_already_cannot_be_closed(engine):
    matcher = engine.compile("json_schema", UNIQUE_NUMBERS).matcher()
    written(matcher, b"[1, 2, ")
    assert {TOKENS.index(b"1,"), TOKENS.index(b"1]")}.isdisjoint(allowed(matcher))  # looked up
    assert TOKENS.index(b"12") in allowed(matcher)
    written(matcher, b"1")
    assert {ord(","), ord("]"), TOKENS.index(b".0,")}.isdisjoint(allowed(matcher))  # 1.0 is 1
    assert ord("0") in allowed(matcher)


def test_a_token_that_writes_a_number_after_a_comma_is_followed(engine):
    matcher = engine.compile("json_schema", UNIQUE_NUMBERS).matcher()
    written(matcher, b"[0, 1")
    assert TOKENS.index(b", 1") in allowed(matcher)  # "1" goes on as 11, say
    assert TOKENS.index(b", 1]") not in allowed(matcher)


ARRAY = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}


@pytest.mark.parametrize(("schema", "paths"), [
    ({"type": "object", "properties": {"t": ARRAY, "o": {"properties": {"u": {"type": "array", "items": ARRAY}}}}},
     {("t",), ("o", "u", ITEMS)}),
    (ARRAY, {()}),
    ({**ARRAY, "items": {"type": "integer", "minimum": 1}}, {()}),
    ({"type": "object"}, set()),
])
def test_arrays_kept_unique_are_found_by_their_paths(schema, paths):
    assert unique_arrays(schema) == paths


@pytest.mark.parametrize("schema", [
    {"$defs": {"t": ARRAY}, "properties": {"t": {"$ref": "#/$defs/t"}}},  # reached through a $ref
    {"properties": {"t": ARRAY, "again": {"$ref": "#"}}},  # its path recurs deeper
    {"anyOf": [ARRAY, {"type": "integer"}]},
    {**ARRAY, "items": {"enum": ["a", "b"]}},  # listed strings: a repeat could be the only way on
    {**ARRAY, "items": {"type": "string", "pattern": "^[ab]$"}},
    {**ARRAY, "items": {"type": "integer", "maximum": 9}},  # a repeat at 9 could be the only way on
    {**ARRAY, "items": {"type": "boolean"}},
])
def test_other_unique_arrays_are_refused(engine, schema):
    assert unique_arrays(schema) is None
    with pytest.raises(GrammarRefused, match="uniqueItems"):
        engine.compile("json_schema", schema)


def test_rolled_back_tokens_are_forgotten(engine):
    """What speculative decoding undoes: the keys and items the rolled-back tokens wrote may be written again, and
    the masks are those from before them."""
    matcher = engine.compile("json_schema", OPEN_KEYS).matcher()
    written(matcher, b'{"a": 1, ')
    before = allowed(matcher)
    written(matcher, b'"b": 2, "')
    assert TOKENS.index(b'b"') not in allowed(matcher)
    matcher.rollback(len(b'"b": 2, "'))
    assert allowed(matcher) == before
    written(matcher, b'"')
    assert TOKENS.index(b'b"') in allowed(matcher) and TOKENS.index(b'a"') not in allowed(matcher)
