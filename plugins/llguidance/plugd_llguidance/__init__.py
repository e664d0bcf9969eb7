"""Structured output for plugd through llguidance: `format` ("json" or a JSON Schema) enforced token by token.

This module is what the daemon loads through the entry point; it names the engine's factory and imports
nothing heavy. Only a runner imports `plugd_llguidance.engine` (and with it llguidance).
"""

from plugd.hookspecs import GrammarEngine, hookimpl

PLUGD_API = "1.2"


@hookimpl
def plugd_grammar_engines() -> list[GrammarEngine]:
    return [GrammarEngine("llguidance", factory="plugd_llguidance.engine:LLGuidanceEngine")]
