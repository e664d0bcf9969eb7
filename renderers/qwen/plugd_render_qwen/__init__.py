"""Qwen chat renderers and output parsers for plugd.

Renderers write the Qwen3, Qwen3-Coder and Qwen3.5 chat templates in Python,
byte for byte as the upstream Jinja templates render, while accepting what
agents send (developer messages, system messages mid-conversation). Parsers
split streamed output into thinking, content and tool calls.
"""

from plugd.hookspecs import hookimpl
from plugd_render_qwen.parsers import PARSERS
from plugd_render_qwen.renderers import RENDERERS

PLUGD_API = "1.2"  # the plugd plugin API this plugin is built for


@hookimpl
def plugd_renderers():
    return list(RENDERERS)


@hookimpl
def plugd_parsers():
    return list(PARSERS)
