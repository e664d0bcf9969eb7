"""Reading request bodies: JSON objects structured into attrs classes, or a clear 400."""

from __future__ import annotations

import json
from typing import TypeVar

from litestar import Request

from plugd.types import structure

T = TypeVar("T")


class BadRequest(ValueError):
    pass


async def read_body(request: Request, cls: type[T]) -> T:
    """The JSON body as `cls`; malformed JSON or fields of the wrong type are a 400 naming the problem."""
    raw = await request.body()
    try:
        data = json.loads(raw or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"invalid JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    try:
        return structure(data, cls)
    except ValueError as exc:
        raise BadRequest(f"invalid request body: {exc}") from None
