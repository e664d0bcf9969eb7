"""`format: regex` is enforced as plugd.json_schema.REGEX_SUBSET: every string a model can write there is a
regular expression that compiles, and the common shapes of one can be written."""

from __future__ import annotations

import json
import random
import re
import warnings

import pytest

from plugd.json_schema import REGEX_SUBSET
from plugd.testing.grammar import BYTES, STOP, accepts, allowed_tokens
from plugd_llguidance.engine import LLGuidanceEngine

SCHEMA = {"type": "string", "format": "regex"}


@pytest.fixture(scope="module")
def engine():
    return LLGuidanceEngine(BYTES)


def random_walk(matcher, rng: random.Random, longest: int) -> str | None:
    """A string the grammar allows, each byte drawn at random from those it allows (None: not closed in time)."""
    written = b""
    for _ in range(longest):
        allowed = allowed_tokens(matcher)
        if STOP in allowed:
            return json.loads(written)
        closing = ord('"') in allowed and len(written) > rng.randint(3, longest // 2)
        token = ord('"') if closing else rng.choice([t for t in allowed if t != ord('"')] or allowed)
        assert matcher.accept(token)
        written += bytes([token])
    return None


def test_every_regex_a_model_can_write_compiles(engine):
    rng, compiled = random.Random(7), engine.compile("json_schema", SCHEMA)
    written = [text for _ in range(300) if (text := random_walk(compiled.matcher(), rng, 80)) is not None]
    assert len(written) > 250
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # re's FutureWarning for nested sets too
        for text in written:
            re.compile(text)
    # The walks reach the subset's every part, so that a grammar that lost one would show here.
    for part in ("(", "[", "\\", "|", "*", "{", "^"):
        assert any(part in text for text in written), part


@pytest.mark.parametrize("regex", ["^[a-z]+(\\.[a-z]+)*$", "^(?:https?://)?[\\w.-]+(:[0-9]{2,})?/?$",
                                   "\\d{4}-\\d{2}", "^(a|b(c|d(e)))$", "[^\\s]+", "x*?y+?"])
def test_common_regexes_can_be_written(engine, regex):
    assert re.fullmatch(REGEX_SUBSET, regex)
    assert accepts(engine, SCHEMA, regex)


@pytest.mark.parametrize("broken", ["(a", "a)", "[a", "*a", "a**", "\\q", "a{2,1}", "a|*", "[]"])
def test_strings_that_do_not_compile_cannot_be_written(engine, broken):
    with pytest.raises(re.error):
        re.compile(broken)
    assert not accepts(engine, SCHEMA, broken)


def test_a_regex_format_beside_a_pattern_is_left_to_the_engine(engine):
    with pytest.raises(Exception, match="format 'regex'"):
        engine.compile("json_schema", {"type": "string", "format": "regex", "pattern": "^a"})
