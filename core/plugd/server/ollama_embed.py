"""Ollama's embedding endpoints: /api/embed (one input or a list) and the older /api/embeddings (one prompt)."""

from __future__ import annotations

from typing import Any

from attrs import define
from litestar import post

from plugd.chat import embedding
from plugd.chat.pipeline import Services
from plugd.server.bodies import json_body


@define(kw_only=True)
class EmbedBody:
    model: str
    input: str | list[str] | None = None
    truncate: bool = True
    dimensions: int | None = None
    keep_alive: str | int | float | None = None
    options: dict[str, Any] | None = None


@define(kw_only=True)
class EmbeddingsBody:
    model: str
    prompt: str = ""
    keep_alive: str | int | float | None = None
    options: dict[str, Any] | None = None


@post("/api/embed", status_code=200, dependencies=json_body(EmbedBody))
async def embed(services: Services, payload: EmbedBody) -> dict[str, Any]:
    inputs = [payload.input] if isinstance(payload.input, str) else payload.input or []
    done = await embedding.embed(services, embedding.EmbedRequest(
        payload.model, inputs, payload.truncate, payload.dimensions, payload.keep_alive, payload.options or {}))
    return {"model": done.model.name.display(), "embeddings": done.vectors, "total_duration": done.total_duration,
            "load_duration": done.load_duration, "prompt_eval_count": done.prompt_tokens}


@post("/api/embeddings", status_code=200, dependencies=json_body(EmbeddingsBody))
async def embeddings(services: Services, payload: EmbeddingsBody) -> dict[str, Any]:
    done = await embedding.embed(services, embedding.EmbedRequest(
        payload.model, [payload.prompt] if payload.prompt else [], keep_alive=payload.keep_alive,
        options=payload.options or {}))
    return {"embedding": done.vectors[0] if done.vectors else []}  # no prompt: the model is loaded, as Ollama does


ROUTES = [embed, embeddings]
