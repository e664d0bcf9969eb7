"""Error bodies in the shape of the dialect a path belongs to: Ollama, OpenAI or Anthropic."""

from __future__ import annotations

from typing import Any

_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error",
                 503: "server_overloaded_error"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def dialect_of(path: str) -> str:
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/v1/"):
        return "openai"
    return "ollama"


def error_body(path: str, status: int, message: str) -> dict[str, Any]:
    """The error object a client of the dialect serving `path` parses as an error of its own kind."""
    dialect = dialect_of(path)
    if dialect == "openai":
        return {"error": {"message": message, "type": _OPENAI_TYPES.get(status, "server_error"), "param": None,
                          "code": None}}
    if dialect == "anthropic":
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}
    return {"error": message}
