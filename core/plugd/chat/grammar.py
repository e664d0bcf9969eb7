"""Structured requests: the grammar a runner enforces for `format` or a forced tool call, or a clear refusal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plugd.chat.request import ChatRequest, InvalidRequest

if TYPE_CHECKING:
    from plugd.chat.pipeline import Services


def grammar_for(services: Services, request: ChatRequest) -> dict[str, Any] | None:
    """The runner's grammar for a structured request, or a clear refusal; None for free text.

    A structured request is enforced token by token by a grammar engine
    plugin, or refused: never served as free text.
    """
    forced_call = request.tool_choice.mode in ("required", "named")
    if forced_call:
        if not request.tools:
            raise InvalidRequest(f"tool_choice {request.tool_choice.mode!r} needs tools")
        if request.tool_choice.name and request.tool_choice.name not in {t.name for t in request.tools}:
            raise InvalidRequest(f"tool_choice names {request.tool_choice.name!r}, which is not among the tools")
    structured = request.format not in (None, "")
    if not structured and not forced_call:
        return None
    wants = "structured output (format)" if structured else f"tool_choice {request.tool_choice.mode!r}"
    engines = services.registry.items.get("plugd_grammar_engines", [])
    if not engines:
        raise InvalidRequest(f"{wants} is not enforced by any installed plugin; install plugd-xgrammar")
    if forced_call:
        raise InvalidRequest(f"{wants} is not supported yet by the installed grammar engine")
    kind = "json" if request.format == "json" else "json_schema" if isinstance(request.format, dict) else None
    if kind is None:
        raise InvalidRequest(f'format must be "json" or a JSON Schema object, not {request.format!r}')
    engine = next((e for e in engines if kind in e.formats), None)
    if engine is None:
        raise InvalidRequest(f"no installed grammar engine enforces {kind} formats")
    return {"engine": engine.name, "factory": engine.factory, "kind": kind, "format": request.format}


