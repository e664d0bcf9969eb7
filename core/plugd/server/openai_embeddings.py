"""OpenAI's /v1/embeddings: `input` as a string, a list of strings, or token ids (one list, or a list of them);
vectors as floats, or as base64 of little-endian float32 (`encoding_format`, which the official client asks for)."""

from __future__ import annotations

import base64
import struct
from typing import Any, Literal

from attrs import define
from litestar import post

from plugd.chat import embedding
from plugd.chat.pipeline import Services
from plugd.server.bodies import BadRequest, json_body


@define(kw_only=True)
class EmbeddingsBody:
    model: str
    input: Any
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


def _inputs(value: Any) -> list[str] | list[list[int]]:
    """The inputs `input` holds; BadRequest naming what is wrong with it."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return value
    if isinstance(value, list) and value and all(isinstance(item, int) and not isinstance(item, bool) for item in value):
        return [value]
    if isinstance(value, list) and value and all(isinstance(item, list) and item and all(
            isinstance(t, int) and not isinstance(t, bool) for t in item) for item in value):
        return value
    if value == [] or value == "":
        raise BadRequest("'input' is empty: give a string, a list of strings, or token ids")
    raise BadRequest("'input' must be a string, a list of strings, a list of token ids, or a list of such lists")


def _encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


@post("/v1/embeddings", status_code=200, dependencies=json_body(EmbeddingsBody))
async def create_embeddings(services: Services, payload: EmbeddingsBody) -> dict[str, Any]:
    done = await embedding.embed(services, embedding.EmbedRequest(
        payload.model, _inputs(payload.input), truncate=False, dimensions=payload.dimensions))
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": _encoded(vector, payload.encoding_format)}
                 for i, vector in enumerate(done.vectors)],
        "model": payload.model,
        "usage": {"prompt_tokens": done.prompt_tokens, "total_tokens": done.prompt_tokens},
    }


ROUTES = [create_embeddings]
