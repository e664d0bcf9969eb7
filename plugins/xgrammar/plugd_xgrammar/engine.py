"""The runner side: xgrammar compiles a format against the model's vocabulary and matches each request's tokens.

Imported only by a runner (through the factory path the plugin declares), since xgrammar imports torch.

Choices, for every schema alike:
- JSON is written compactly (no free whitespace: a model cannot stall in blank space), separators ", " / ": ".
- A schema means what JSON Schema says: properties it does not close may appear, arrays without `items` take
  any items (xgrammar's "strict mode", which would forbid both, is off). `format: "json"` is any JSON object.
- Dates and times are real ones (see `plugd.json_schema`), not just digits in the right places.
- Keywords xgrammar does not take are rewritten where an exact equal exists (`plugd.schema_rewrites`).
- A schema feature xgrammar would not enforce (see `coverage`, and the warnings it logs) refuses the request.
"""

from __future__ import annotations

import json
from functools import cache

import numpy as np
import xgrammar as xgr

from plugd.json_schema import with_format_patterns
from plugd.json_uniqueness import TokenIndex, UniqueValues, unique_arrays, without_unique_items
from plugd.runner_api import GrammarRefused, GrammarVocabulary, SchemaCache
from plugd.schema_rewrites import rewritten
from plugd_xgrammar.coverage import unenforced_features
from plugd_xgrammar.native_log import native_message, with_native_warnings


class XGrammarMatcher:
    def __init__(self, matcher: xgr.GrammarMatcher):
        self._matcher = matcher

    def fill_mask(self, bitmask: np.ndarray) -> None:
        self._matcher.fill_next_token_bitmask(bitmask)

    def accept(self, token: int) -> bool:
        return self._matcher.accept_token(token)

    def rollback(self, count: int) -> None:
        self._matcher.rollback(count)


class XGrammarCompiled:
    def __init__(self, compiled: xgr.CompiledGrammar, quotes: TokenIndex, unique: frozenset):
        self._compiled, self._quotes, self._unique = compiled, quotes, unique

    def matcher(self) -> UniqueValues:
        return UniqueValues(XGrammarMatcher(xgr.GrammarMatcher(self._compiled)), self._quotes, self._unique)


class XGrammarEngine:
    """One model's compiler; it keeps the last compiled schemas (and refusals) in a SchemaCache, with the token
    masks their requests have worked out so far."""

    def __init__(self, vocabulary: GrammarVocabulary):
        info = xgr.TokenizerInfo(vocabulary.token_bytes, xgr.VocabType.RAW, vocab_size=vocabulary.width,
                                 stop_token_ids=sorted(vocabulary.stop_ids) or None)
        # Token masks are worked out per grammar state on first use, not all at compile time: a large
        # vocabulary makes the eager way take seconds to a minute per schema, and a request visits few states.
        self._compiler = xgr.GrammarCompiler(info, cache_enabled=False, enable_dynamic_compilation=True)
        self._quotes = TokenIndex(vocabulary.token_bytes)
        self.compile = SchemaCache(self._compile).compile

    def _compile(self, schema: dict | bool) -> XGrammarCompiled:
        grammar, unique = to_grammar(schema)
        return XGrammarCompiled(self._compiler.compile_grammar(grammar), self._quotes, unique)


def to_grammar(schema: dict | bool) -> tuple[xgr.Grammar, frozenset]:
    """xgrammar's grammar for a JSON schema, and the paths of the arrays whose uniqueItems its matchers keep
    (plugd.json_uniqueness); or GrammarRefused naming what it would not enforce."""
    schema = rewritten(schema, false_schemas=False)  # xgrammar refuses `false` subschemas
    if (unique := unique_arrays(schema)) is not None:
        schema = without_unique_items(schema)
    problems = unenforced_features(schema, format_enforced)
    patterned = json.dumps(with_format_patterns(schema))
    try:
        grammar, warnings = with_native_warnings(lambda: _convert(patterned))
        problems += warnings
    except RuntimeError as exc:  # xgrammar's errors for what it cannot convert at all
        problems.append(f"{native_message(exc)} (xgrammar cannot compile it)")
    if problems:
        raise GrammarRefused("xgrammar cannot enforce this JSON schema: " + "; ".join(problems))
    return grammar, unique or frozenset()


def _convert(schema_json: str) -> xgr.Grammar:
    return xgr.Grammar.from_json_schema(schema_json, any_whitespace=False, strict_mode=False)


@cache
def format_enforced(name: str) -> bool:
    """Whether xgrammar constrains strings of this `format` (it ignores formats it does not know): a single
    space, which no standard format allows but `regex`, must not get through."""
    grammar = _convert(json.dumps({"type": "string", "format": name}))
    return not xgr.GrammarMatcher(_byte_compiler().compile_grammar(grammar)).accept_string('" "')


@cache
def _byte_compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(xgr.TokenizerInfo([bytes([b]) for b in range(256)], vocab_size=256))
