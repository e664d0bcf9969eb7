"""The runner side: llguidance compiles a format against the model's vocabulary and matches each request's tokens.

Imported only by a runner (through the factory path the plugin declares).

Choices, the same as plugd-xgrammar's where both apply:
- JSON is written compactly (no free whitespace: a model cannot stall in blank space), separators ", " / ": ".
- A schema means what JSON Schema says: properties it does not close may appear, arrays without `items` take
  any items. `format: "json"` is any JSON object.
- Dates and times are real ones (see `plugd.json_schema`); a format JSON Schema does not define is the annotation
  it is, and is dropped. Keywords llguidance does not take are rewritten where an exact equal exists
  (`plugd.schema_rewrites`).
- llguidance runs strict: a keyword it does not implement, a format it does not know, a oneOf it cannot prove
  exclusive, or any other warning refuses the request, naming each one and where it is. So does what it
  accepts without enforcing it (`unenforced`).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import llguidance as llg
import numpy as np

from plugd.json_schema import PATTERNS, subschemas, with_format_patterns, without_annotations
from plugd.json_uniqueness import TokenIndex, UniqueValues, unique_arrays, without_unique_items
from plugd.runner_api import GrammarRefused, GrammarVocabulary, SchemaCache
from plugd.schema_rewrites import rewritten

OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": False,
           "coerce_one_of": False}
MAX_ROUNDS = 16
_UNIMPLEMENTED = re.compile(r"^Unimplemented keys: (\[.*\])$")
_UNKNOWN_FORMAT = re.compile(r"^Unknown format: (.*)$")


class _TokenTable:
    """The vocabulary as llguidance's TokenizerWrapper reads it.

    Tokens that never belong in structured text (b"" in a GrammarVocabulary) get a name that starts with 0xFF,
    as llguidance names special tokens: no UTF-8 text, so no grammar, ever contains one.
    """

    def __init__(self, vocabulary: GrammarVocabulary):
        self.tokens = [text or b"\xff<%d>" % t for t, text in enumerate(vocabulary.token_bytes)]
        self.special_token_ids = [t for t, text in enumerate(vocabulary.token_bytes) if not text]
        self.eos_token_id = min(vocabulary.stop_ids, default=None)
        self.bos_token_id = None
        self._ids: dict[bytes, int] = {}
        for t, text in enumerate(vocabulary.token_bytes):
            if text:
                self._ids.setdefault(text, t)
        self._longest = max(map(len, self._ids), default=1)

    def __call__(self, text: bytes) -> list[int]:
        """Longest-match tokenization. llguidance tokenizes only text the grammar forces, to allow the first token
        of it; any tokenization of that text is one the grammar allows."""
        tokens, i = [], 0
        while i < len(text):
            for length in range(min(self._longest, len(text) - i), 0, -1):
                if (token := self._ids.get(text[i : i + length])) is not None:
                    tokens.append(token)
                    i += length
                    break
            else:
                raise ValueError(f"no token of the vocabulary starts with byte {text[i]:#04x}")
        return tokens


class LLGuidanceMatcher:
    def __init__(self, matcher: llg.LLMatcher):
        self._matcher = matcher

    def fill_mask(self, bitmask: np.ndarray) -> None:
        self._matcher.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)
        if self._matcher.is_error():
            raise RuntimeError(f"llguidance: {self._matcher.get_error()}")

    def accept(self, token: int) -> bool:
        return self._matcher.consume_token(token) and not self._matcher.is_error()

    def rollback(self, count: int) -> None:
        if not self._matcher.rollback(count):
            raise RuntimeError(f"llguidance: {self._matcher.get_error()}")


class LLGuidanceCompiled:
    def __init__(self, tokenizer: llg.LLTokenizer, grammar: str, quotes: TokenIndex, unique: frozenset):
        self._tokenizer, self._grammar, self._quotes, self._unique = tokenizer, grammar, quotes, unique

    def matcher(self) -> UniqueValues:
        inner = LLGuidanceMatcher(llg.LLMatcher(self._tokenizer, self._grammar, log_level=0))
        return UniqueValues(inner, self._quotes, self._unique)


class LLGuidanceEngine:
    """One model's compiler; it keeps the last compiled schemas (and refusals) in a SchemaCache."""

    def __init__(self, vocabulary: GrammarVocabulary):
        table = _TokenTable(vocabulary)
        self._quotes = TokenIndex(vocabulary.token_bytes)
        self._tokenizer = llg.LLTokenizer(llg.TokenizerWrapper(table), n_vocab=vocabulary.width,
                                          eos_token=sorted(vocabulary.stop_ids) or None)
        self.compile = SchemaCache(self._compile).compile

    def _compile(self, schema: dict | bool) -> LLGuidanceCompiled:
        schema = rewritten(schema)
        if schema is False:
            raise GrammarRefused("llguidance cannot enforce this JSON schema: false allows no value at /")
        schema = {} if schema is True else schema
        problems = unenforced(schema)
        schema = with_format_patterns(without_annotations(schema))
        if (unique := unique_arrays(schema)) is not None:  # kept by UniqueValues, not by the grammar
            schema = without_unique_items(schema)
        grammar = self._grammar(schema)
        # llguidance stops at the first thing it cannot enforce: take it out and look again, to name every one.
        for _ in range(MAX_ROUNDS):
            failed, messages = llg.LLMatcher.validate_grammar_with_warnings(self._grammar(schema), self._tokenizer)
            if not (failed or messages):
                break
            found, schema = _set_aside(schema, messages)
            problems += found
            if schema is None:
                break
        if problems:
            raise GrammarRefused("llguidance cannot enforce this JSON schema: " + "; ".join(problems))
        return LLGuidanceCompiled(self._tokenizer, grammar, self._quotes, unique or frozenset())

    @staticmethod
    def _grammar(schema: dict) -> str:
        return llg.LLMatcher.grammar_from_json_schema(schema, defaults=OPTIONS)


def unenforced(schema: dict) -> list[str]:
    """What llguidance accepts without enforcing it (found by probing it: plugd.testing.grammar), each named with
    where it is."""
    problems = []
    for pointer, node in subschemas(schema):
        found = []
        if node.get("format") in PATTERNS and "pattern" in node:  # its own date grammars are loose
            found.append(f"format {node['format']!r} together with a pattern")
        found += [f"'{bound}' as a boolean (draft-04)" for bound in ("exclusiveMinimum", "exclusiveMaximum")
                  if isinstance(node.get(bound), bool)]
        if isinstance(node.get("items"), list):
            found.append("'items' as a list (draft-04 tuples; 2020-12 has prefixItems)")
        problems += [f"{problem} at {pointer or '/'}" for problem in found]
    return problems


def _set_aside(schema: dict, messages: list[str]) -> tuple[list[str], dict | None]:
    """What llguidance's messages name, each with where it is in `schema`, and a copy of `schema` without them
    (None when a message names nothing that can be taken out)."""
    found, aside = [], copy.deepcopy(schema)
    for message in (message.strip() for message in messages):
        targets = _targets(message)
        if not targets:
            return [*found, message], None
        for pointer, node in list(subschemas(aside)):
            for key, value in targets:
                if key in node and value in (None, node[key]):
                    found.append(f"{_name(key, node[key])} at {pointer or '/'}")
                    if key == "oneOf":  # looked at again as the anyOf it would be
                        node["anyOf"] = node.pop("oneOf")
                    else:
                        del node[key]
    return found, aside


def _targets(message: str) -> list[tuple[str, Any]]:
    """The (keyword, value) pairs a message of llguidance's is about; value None: whatever the value."""
    if match := _UNIMPLEMENTED.match(message):
        return [(key, None) for key in json.loads(match[1])]
    if match := _UNKNOWN_FORMAT.match(message):
        return [("format", match[1])]
    if message.startswith("oneOf "):
        return [("oneOf", None)]
    return []


def _name(key: str, value: Any) -> str:
    if key == "format":
        return f"format {value!r}"
    if key == "oneOf":
        return "'oneOf' whose branches it cannot prove exclusive"
    return f"'{key}'"
