"""Ollama's `/api/pull` and `/api/push`: a registry transfer (or a pull from the Hugging Face Hub, for hf.co
names) runs on a thread of its own and its progress is streamed as Ollama's NDJSON status lines; a client that
goes away cancels it (a registry pull resumes next time)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import anyio
from attrs import define
from litestar import Response, post

from plugd.chat.pipeline import Services
from plugd.hub.pull import pull_from_hub
from plugd.hub.reference import is_hub_host
from plugd.registry.errors import RegistryError
from plugd.registry.pull import pull_model
from plugd.registry.push import push_model
from plugd.server.bodies import BadRequest, json_body
from plugd.server.sse import NDJSON, streamed
from plugd.store.names import ModelName

log = logging.getLogger(__name__)

Job = Callable[..., None]  # called with emit= and cancel=


@define
class TransferRequest:
    model: str | None = None
    name: str | None = None
    insecure: bool = False
    stream: bool = True

    def model_name(self) -> ModelName:
        if not (self.model or self.name):
            raise BadRequest("model is required")
        return ModelName.parse(self.model or self.name)


@post("/api/pull", status_code=200, dependencies=json_body(TransferRequest))
async def pull(services: Services, payload: TransferRequest) -> Any:
    name, store = payload.model_name(), services.store
    if is_hub_host(name.host):  # the name as typed: the Hub's repository names are case-sensitive
        job = partial(pull_from_hub, store, services.registry, payload.model or payload.name)
    else:
        job = partial(pull_model, store, name, insecure=payload.insecure)
    return await _transfer(job, payload.stream)


@post("/api/push", status_code=200, dependencies=json_body(TransferRequest))
async def push(services: Services, payload: TransferRequest) -> Any:
    store, name = services.store, payload.model_name()
    if is_hub_host(name.host):
        raise BadRequest(f"plugd does not push to the Hugging Face Hub ({name.host}); upload a model directory "
                         "there with `hf upload`, or push to an OCI registry")
    await anyio.to_thread.run_sync(store.get, name)  # an unknown model is a 404 before anything streams
    return await _transfer(partial(push_model, store, name, insecure=payload.insecure), payload.stream)


async def _transfer(job: Job, stream: bool) -> Response[Any]:
    if stream:
        return streamed(_progress_lines(job), NDJSON)
    try:
        await anyio.to_thread.run_sync(partial(job, cancel=threading.Event()))
    except RegistryError as exc:
        return Response({"error": str(exc)}, status_code=exc.status)
    return Response({"status": "success"}, status_code=200)


async def _progress_lines(job: Job) -> AsyncIterator[bytes]:
    send, receive = anyio.create_memory_object_stream[dict[str, Any]](math.inf)
    loop = asyncio.get_running_loop()
    cancel = threading.Event()

    def deliver(function: Callable[..., None], *args: Any) -> None:
        try:
            function(*args)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            cancel.set()  # nobody is listening any more

    def on_loop(function: Callable[..., None], *args: Any) -> None:
        # Handed over without waiting: the transfer's threads (a blob's hasher among them) never stall on the
        # event loop, which a blocking call made them do for every progress line.
        try:
            loop.call_soon_threadsafe(deliver, function, *args)
        except RuntimeError:
            cancel.set()  # the loop is closed

    def run() -> None:
        try:
            job(emit=partial(on_loop, send.send_nowait), cancel=cancel)
        except RegistryError as exc:
            on_loop(send.send_nowait, {"error": str(exc)})
        except Exception as exc:
            log.error("transfer failed: %s", exc, exc_info=exc)
            on_loop(send.send_nowait, {"error": str(exc) or type(exc).__name__})
        finally:
            on_loop(send.close)

    threading.Thread(target=run, name="plugd-transfer", daemon=True).start()
    try:
        async with receive:
            async for item in receive:
                yield json.dumps(item).encode() + b"\n"
    finally:
        cancel.set()


ROUTES = [pull, push]
