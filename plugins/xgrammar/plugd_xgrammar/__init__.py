"""Structured output for plugd through xgrammar: `format` ("json" or a JSON Schema) enforced token by token.

This module is what the daemon loads through the entry point; it names the engine's factory and imports
nothing heavy. Only a runner imports `plugd_xgrammar.engine` (and with it xgrammar and torch).
"""

from plugd.hookspecs import GrammarEngine, hookimpl

PLUGD_API = "1.2"


@hookimpl
def plugd_grammar_engines() -> list[GrammarEngine]:
    return [GrammarEngine("xgrammar", factory="plugd_xgrammar.engine:XGrammarEngine")]
