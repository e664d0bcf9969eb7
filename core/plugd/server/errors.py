"""Error bodies in each dialect's shape: Ollama's, OpenAI's or Anthropic's.

Each dialect's router answers its routes' failures in its own shape (plugd.server.app). Only what answers before
any route is chosen (the host and origin guards, a path no route has) goes by the path (`dialect_of`).
"""

from __future__ import annotations

import errno
import json
from typing import Any, Literal

from litestar.exceptions import HTTPException
from litestar.types import Send

from plugd.chat.request import ContextExceeded
from plugd.errors import PlugdError

_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error",
                 503: "server_overloaded_error"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def status_of(exc: Exception) -> tuple[int, str]:
    """The HTTP status a failure answers with, and its message."""
    if isinstance(exc, HTTPException):
        return exc.status_code, exc.detail
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return 507, "no space left on the model store's disk: free some space, or remove models"
    return (exc.status if isinstance(exc, PlugdError) else 500), str(exc) or type(exc).__name__


def failure_body(dialect: Dialect, path: str, exc: Exception) -> tuple[int, dict[str, Any]]:
    """The status and the error object `dialect` answers a failure of `path` with: as the response, or as a
    stream's error event once the stream has begun."""
    if isinstance(exc, ContextExceeded):
        return 400, context_exceeded_body(dialect, path, exc)
    status, message = status_of(exc)
    return status, error_body(dialect, status, message, exc.kind if isinstance(exc, PlugdError) else None)


Dialect = Literal["ollama", "openai", "anthropic"]


def dialect_of(path: str) -> Dialect:
    """The dialect whose routes `path` would be among."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/v1/"):
        return "openai"
    return "ollama"


def error_body(dialect: Dialect, status: int, message: str, kind: str | None = None) -> dict[str, Any]:
    """The error object a client of `dialect` parses as an error of its own kind; OpenAI's says the failure's
    `kind` as its code (Ollama's and Anthropic's shapes have no place for it)."""
    if dialect == "openai":
        return {"error": {"message": message, "type": _OPENAI_TYPES.get(status, "server_error"), "param": None,
                          "code": kind}}
    if dialect == "anthropic":
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}
    return {"error": message}


async def send_error(send: Send, path: str, status: int, message: str) -> None:
    """Answer an HTTP request with `error_body`, from ASGI middleware that runs before the app routes it."""
    body = json.dumps(error_body(dialect_of(path), status, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


# What an OpenAI endpoint calls the part of the request that holds the prompt.
_OPENAI_PROMPT_PARAMS = {"/v1/completions": "prompt", "/v1/responses": "input"}


def context_exceeded_body(dialect: Dialect, path: str, exc: ContextExceeded) -> dict[str, Any]:
    """A prompt over the context, worded as the real API words it, so that clients that parse it react (Claude
    Code compacts on Anthropic's "prompt is too long"; OpenAI clients read the code context_length_exceeded).
    `path` says which OpenAI endpoint, each naming the prompt's part of the request its own way."""
    if dialect == "anthropic":
        return error_body(dialect, 400, f"prompt is too long: {exc.prompt_tokens} tokens > {exc.limit} maximum")
    if dialect == "openai":
        param = _OPENAI_PROMPT_PARAMS.get(path, "messages")
        part = "prompt" if param == "prompt" else "messages"
        message = (f"This model's maximum context length is {exc.context_length} tokens. However, your {part} "
                   f"resulted in {exc.prompt_tokens} tokens. Please reduce the length of the {part}.")
        if param == "input":  # the Responses API words it without the figures
            message = "Your input exceeds the context window of this model. Please adjust your input and try again."
        body = error_body(dialect, 400, message)
        body["error"] |= {"param": param, "code": "context_length_exceeded"}
        return body
    return error_body(dialect, 400, str(exc))
