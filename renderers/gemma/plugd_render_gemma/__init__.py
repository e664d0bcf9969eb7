"""Gemma chat renderers and output parsers for plugd.

Renderers: `gemma3`, and `gemma4` (large models), `gemma4-e2b` (small models),
each Gemma 4 one also in its April 2026 revision (`gemma4-2026-04`,
`gemma4-e2b-2026-04`). Parser: `gemma4` (thinking and native tool calls).
Gemma 3 has no parser: it has neither thinking nor tool calls, so all its
output is content, which is what plugd does for a model without a parser.
"""

from __future__ import annotations

from plugd.hookspecs import ModelFiles, Parser, Renderer, hookimpl
from plugd_render_gemma import gemma3, gemma4_parser
from plugd_render_gemma.gemma4 import Gemma4Template, is_gemma4_template

PLUGD_API = "1.2"  # the plugd plugin API this plugin is built for

GEMMA4_TEMPLATES = {
    "gemma4": Gemma4Template(empty_thought_channel=True),
    "gemma4-e2b": Gemma4Template(empty_thought_channel=False),
    "gemma4-2026-04": Gemma4Template(empty_thought_channel=True, april=True),
    "gemma4-e2b-2026-04": Gemma4Template(empty_thought_channel=False, april=True),
}


# Ollama's names for the same renderer (model/renderers/renderer.go in ollama/ollama).
OLLAMA_NAMES = {"gemma4": ("gemma4-small",)}


@hookimpl
def plugd_renderers():
    gemma4_renderers = [Renderer(name=name, render=t.render, detect=t.detect, aliases=OLLAMA_NAMES.get(name, ()))
                        for name, t in GEMMA4_TEMPLATES.items()]
    return [Renderer(name="gemma3", render=gemma3.render, detect=gemma3.detect), *gemma4_renderers]


def _detect_gemma4(model: ModelFiles) -> bool:
    return is_gemma4_template(model.chat_template or "")


@hookimpl
def plugd_parsers():
    return [Parser(name="gemma4", create=gemma4_parser.create, detect=_detect_gemma4, aliases=("gemma4-no-thinking",))]
