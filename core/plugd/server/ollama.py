"""Ollama's HTTP API: the model-management routes, in its exact request and response shapes."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx
from attrs import define
from cattrs.gen import make_dict_structure_fn, override
from litestar import Request, Response, delete, get, head, post

from plugd import __version__
from plugd.chat.pipeline import Services
from plugd.scheduler.runner_client import RunnerError, RunnerProcess
from plugd.server.bodies import BadRequest, json_body
from plugd.server.model_views import details, show_payload, tags_entry
from plugd.server.sse import NDJSON, streamed
from plugd.store.create import CreateRequest, create_model
from plugd.store.integrity import damage
from plugd.store.names import ModelName
from plugd.store.ollama_format import config_view
from plugd.store.store import CorruptModel
from plugd.types import converter

converter.register_structure_hook(
    CreateRequest, make_dict_structure_fn(CreateRequest, converter, from_=override(rename="from"))
)
log = logging.getLogger(__name__)


@define
class ModelRequest:
    """Bodies that name one model: `model`, or the older `name`."""

    model: str | None = None
    name: str | None = None
    verbose: bool = False

    def model_name(self) -> ModelName:
        if not (self.model or self.name):
            raise BadRequest("model is required")
        return ModelName.parse(self.model or self.name)


@define
class CopyRequest:
    source: str
    destination: str


@get("/", sync_to_thread=False, media_type="text/plain")
def root() -> str:
    return "Ollama is running"


@head("/", sync_to_thread=False)
def root_head() -> None:
    return None


# The Ollama release whose HTTP API plugd's Ollama routes answer as: /api/version reports it, so that clients that
# gate on Ollama's version (`codex --oss` wants 0.13.4 or newer) accept plugd. 0.19.0 is the release line of the MLX
# (safetensors) models plugd pulls and pushes, whose manifests say `"requires": "0.19.0"`.
OLLAMA_API_VERSION = "0.19.0"


@get("/api/version", sync_to_thread=False)
def version() -> dict[str, str]:
    """The Ollama API version plugd is compatible with; plugd's own version in the extra field `plugd`."""
    return {"version": OLLAMA_API_VERSION, "plugd": __version__}


@get("/api/tags")
async def tags(request: Request, services: Services) -> dict[str, Any]:
    store = services.store

    def entries() -> list[dict[str, Any]]:
        out = []
        for model in store.list():
            try:
                entry = tags_entry(model, config_view(store, model))
                if (problem := damage(store, model.manifest, verify=False)) is not None:
                    entry["damaged"] = problem  # listed, so that it can be seen and removed; loading it fails
                out.append(entry)
            except CorruptModel as exc:
                log.warning("leaving out of /api/tags: %s", exc)
        return out

    return {"models": await anyio.to_thread.run_sync(entries)}


@get("/api/ps")
async def ps(request: Request, services: Services) -> dict[str, Any]:
    scheduler = services.scheduler
    models = []
    entries = list(scheduler.loaded.values())
    statuses: list[dict[str, Any]] = [{}] * len(entries)

    async def fetch(index: int, runner: RunnerProcess) -> None:
        statuses[index] = await _status(runner)

    async with anyio.create_task_group() as tasks:  # at once: a wedged runner delays the answer by one timeout
        for index, entry in enumerate(entries):
            tasks.start_soon(fetch, index, entry.runner)
    for entry, status in zip(entries, statuses):
        name = entry.model.name.display()
        expires = "0001-01-01T00:00:00Z" if entry.expires_at == math.inf else datetime.fromtimestamp(
            entry.expires_at, UTC).isoformat()
        models.append({
            "name": name,
            "model": name,
            "size": entry.size,
            "digest": entry.model.digest,
            "details": details(entry.model.config),
            "expires_at": expires,
            "size_vram": entry.size if status.get("device") == "gpu" else 0,  # MLX runs a model on one device
            "context_length": entry.num_ctx,
        } | ({"prompt_cache": status["cache"]} if "cache" in status else {})
          | ({"group": status["group"]} if "group" in status else {})
          | ({"drafting": status["drafting"]} if "drafting" in status else {}))
    return {"models": models}


async def _status(runner: RunnerProcess) -> dict[str, Any]:
    """The runner's status (its device, its prompt cache's figures); empty while it cannot answer (one that
    answers nothing within its status timeout is killed as wedged)."""
    try:
        return await runner.status()
    except (httpx.HTTPError, ValueError, RunnerError):
        return {}


@post("/api/show", status_code=200, dependencies=json_body(ModelRequest))
async def show(services: Services, payload: ModelRequest) -> dict[str, Any]:
    store = services.store
    name = payload.model_name()
    registry = services.registry
    return await anyio.to_thread.run_sync(
        lambda: show_payload(store, store.get(name), verbose=payload.verbose, registry=registry))


@post("/api/verify", status_code=200, dependencies=json_body(ModelRequest))
async def verify(services: Services, payload: ModelRequest) -> dict[str, Any]:
    """plugd's own: every blob of the named model (of all models without a name) hashed against its digest."""
    store = services.store

    def check() -> list[dict[str, Any]]:
        models = [store.get(payload.model_name())] if payload.model or payload.name else store.list()
        return [{"name": m.name.display(), "damaged": damage(store, m.manifest, full=True)} for m in models]

    return {"models": await anyio.to_thread.run_sync(check)}


@post("/api/copy", status_code=200, dependencies=json_body(CopyRequest))
async def copy(services: Services, payload: CopyRequest) -> None:
    source, destination = ModelName.parse(payload.source), ModelName.parse(payload.destination)
    store = services.store
    await anyio.to_thread.run_sync(store.copy, source, destination)


@delete("/api/delete", status_code=200, dependencies=json_body(ModelRequest))
async def delete_model(services: Services, payload: ModelRequest) -> None:
    """Delete a model; its runner unloads too (once its requests finish) unless another name still refers to it."""
    store = services.store

    def delete() -> str | None:
        digest = store.get(payload.model_name()).manifest.digest()
        store.delete(payload.model_name())
        return None if any(m.manifest.digest() == digest for m in store.list()) else digest

    if orphaned := await anyio.to_thread.run_sync(delete):
        await services.scheduler.unload(orphaned)


@head("/api/blobs/{digest:str}")
async def blob_exists(services: Services, digest: str) -> Response[None]:
    exists = await anyio.to_thread.run_sync(services.store.blobs.exists, digest)
    return Response(None, status_code=200 if exists else 404)


@post("/api/blobs/{digest:str}", request_max_body_size=None)
async def upload_blob(request: Request, services: Services, digest: str) -> Response[None]:
    blobs = services.store.blobs
    if blobs.exists(digest):
        return Response(None, status_code=200)
    with blobs.writer(digest) as writer:
        async for chunk in request.stream():
            writer.write(chunk)
        await anyio.to_thread.run_sync(writer.commit)
    return Response(None, status_code=201)


@post("/api/create", status_code=200, dependencies=json_body(CreateRequest))
async def create(services: Services, payload: CreateRequest) -> Any:
    store, registry = services.store, services.registry
    statuses: list[str] = []
    await anyio.to_thread.run_sync(lambda: create_model(store, registry, payload, statuses.append))
    statuses.append("success")
    if not payload.stream:
        return Response({"status": "success"}, status_code=200)
    return streamed(_ndjson({"status": s} for s in statuses), NDJSON)


async def _ndjson(items) -> AsyncIterator[bytes]:
    for item in items:
        yield json.dumps(item).encode() + b"\n"


ROUTES = [root, root_head, version, tags, ps, show, verify, copy, delete_model, blob_exists, upload_blob, create]
