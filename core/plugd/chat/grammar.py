"""Structured requests: the grammar a runner enforces for `format` or a forced tool call, or a clear refusal.

A structured request is enforced token by token by a grammar engine plugin,
or refused: never served as free text.
"""

from __future__ import annotations

from attrs import define

from plugd.chat.request import ChatRequest, InvalidRequest
from plugd.hookspecs import ForcedCall, GrammarEngine, Parser
from plugd.plugins import Registry
from plugd.protocol import GrammarSpec


@define(frozen=True)
class Structured:
    """What the runner enforces for one request, and for a forced call how its prompt and output are framed."""

    grammar: GrammarSpec
    forced_call: ForcedCall | None = None


def grammar_engines(registry: Registry, request: ChatRequest, order: tuple[str, ...] | None = None
                    ) -> list[GrammarEngine]:
    """The engines that may enforce this request, in the order they are tried (`order` names them; None: every
    installed one, by name); none for free text. Refused before any model loads."""
    forced = request.tool_choice.mode in ("required", "named")
    if forced:
        if not request.tools:
            raise InvalidRequest(f"tool_choice {request.tool_choice.mode!r} needs tools")
        if request.tool_choice.name and request.tool_choice.name not in {t.name for t in request.tools}:
            raise InvalidRequest(f"tool_choice names {request.tool_choice.name!r}, which is not among the tools")
    structured = request.format not in (None, "")
    if not structured and not forced:
        return []
    wants = "structured output (format)" if structured else f"tool_choice {request.tool_choice.mode!r}"
    if structured and forced:
        raise InvalidRequest("a format and a forced tool call cannot be combined")
    installed = {engine.name: engine for engine in registry.items.get("plugd_grammar_engines", [])}
    if not installed:
        raise InvalidRequest(f"{wants} is not enforced by any installed plugin; install plugd-llguidance or "
                             f"plugd-xgrammar")
    engines = [installed[name] for name in (sorted(installed) if order is None else order) if name in installed]
    if not engines:
        raise InvalidRequest(f"{wants} needs a grammar engine, and none of PLUGD_GRAMMAR_ENGINES "
                             f"({', '.join(order)}) is installed; installed: {', '.join(installed)}")
    kind = _kind(request)
    engines = [engine for engine in engines if kind in engine.formats]
    if not engines:
        raise InvalidRequest(f"no grammar engine in use enforces {kind} formats")
    return engines


def _kind(request: ChatRequest) -> str:
    if request.format in (None, "") or isinstance(request.format, dict):
        return "json_schema"
    if request.format == "json":
        return "json"
    raise InvalidRequest(f'format must be "json" or a JSON Schema object, not {request.format!r}')


def structured(engines: list[GrammarEngine], request: ChatRequest, parser: Parser | None, prompt: str) -> Structured:
    """The grammar for `request`, whose rendered prompt is `prompt`, read back by the model's `parser`."""
    names = tuple(engine.name for engine in engines)
    if request.tool_choice.mode in ("required", "named"):
        if parser is None or parser.forced_call is None:
            which = f"its parser {parser.name!r}" if parser else "it has no output parser"
            raise InvalidRequest(f"tool_choice {request.tool_choice.mode!r} cannot be enforced for this model: "
                                 f"{which} cannot force a tool call")
        tools = [t for t in request.tools if request.tool_choice.name in (None, t.name)]
        forced = parser.forced_call(tools)
        return Structured(GrammarSpec(names, "json_schema", dict(forced.schema)), forced)
    after = parser.answer_after(prompt) if parser is not None and parser.answer_after is not None else None
    return Structured(GrammarSpec(names, _kind(request), request.format, after))
