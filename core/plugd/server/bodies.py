"""Reading request bodies: JSON objects structured into attrs classes, or a clear 400."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import TypeVar

from litestar import Request
from litestar.di import Provide

from plugd.errors import PlugdError
from plugd.types import structure

T = TypeVar("T")


# A \\u escape of a UTF-16 surrogate: only a text holding one can hold a lone one, which no UTF-8 text can.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class BadRequest(PlugdError, ValueError):
    status = 400


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes) -> object:
    """Strict JSON: no NaN or Infinity, no lone surrogates, nesting only as deep as Python's parser reaches."""
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise BadRequest(f"invalid JSON body: {exc}") from None
    except RecursionError:
        raise BadRequest("invalid JSON body: nested too deeply") from None
    if _SURROGATE_ESCAPE.search(raw):
        try:
            json.dumps(data, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise BadRequest("invalid JSON body: a string holds a lone UTF-16 surrogate, which is not Unicode text") \
                from None
    return data


def json_body(cls: type[T], read: Callable[[Request, type[T]], Awaitable[T]] | None = None) -> dict[str, Provide]:
    """A route's `dependencies` for taking its JSON body typed, as `payload: cls`: read by `read` (read_body: strict
    JSON, structured), before the handler runs; the OpenAPI document reads the type from the handler."""
    reader = read or read_body

    async def provide(request: Request) -> T:
        return await reader(request, cls)

    return {"payload": Provide(provide)}


async def read_body(request: Request, cls: type[T]) -> T:
    """The JSON body as `cls`; malformed JSON or fields of the wrong type are a 400 naming the problem."""
    data = parse_json(await request.body() or b"{}")
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    try:
        return structure(data, cls)
    except ValueError as exc:
        raise BadRequest(f"invalid request body: {exc}") from None
