"""The Litestar application: routes from each dialect module, shared state, and errors in each dialect's shape."""

from __future__ import annotations

import errno
import logging
from typing import Any

from litestar import Litestar, Request, Response
from litestar.datastructures import State
from litestar.exceptions import HTTPException

from plugd.chat.models import UnsupportedModel
from plugd.chat.pipeline import ContextExceeded, InvalidRequest, Services, UnparseableOutput
from plugd.plugins import Registry
from plugd.scheduler.runner_client import RunnerRejected, UnloadableModel
from plugd.scheduler.scheduler import QueueFull, Scheduler
from plugd.server import anthropic, ollama, ollama_generate, ollama_registry, openai, openai_responses
from plugd.server.bodies import BadRequest
from plugd.server.cors import cors_config
from plugd.server.disconnect import ClientGone
from plugd.server.errors import context_exceeded_body, error_body
from plugd.server.openapi import describe_bodies_and_errors
from plugd.store.blobs import DigestMismatch, InvalidDigest
from plugd.store.create import CreateError
from plugd.store.model_files import MalformedModelFile
from plugd.store.names import InvalidName
from plugd.store.store import CorruptModel, ModelNotFound, Store

log = logging.getLogger(__name__)

# Room for a conversation with several large base64 images; blob uploads (any size) stream past this limit.
MAX_REQUEST_BYTES = 64 << 20


_STATUS = {
    BadRequest: 400,
    InvalidName: 400,
    InvalidDigest: 400,
    DigestMismatch: 400,
    CreateError: 400,
    ModelNotFound: 404,
    InvalidRequest: 400,
    RunnerRejected: 400,
    UnloadableModel: 400,
    UnparseableOutput: 500,
    UnsupportedModel: 400,
    QueueFull: 503,
    ClientGone: 499,  # nginx's "client closed request": nobody reads it, but the log line says what happened
    CorruptModel: 500,
    MalformedModelFile: 500,
}


def _error_response(request: Request, exc: Exception) -> Response[Any]:
    if isinstance(exc, ContextExceeded):
        return Response(context_exceeded_body(request.url.path, exc), status_code=400)
    if isinstance(exc, HTTPException):
        status, message = exc.status_code, exc.detail
    elif isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        status, message = 507, "no space left on the model store's disk: free some space, or remove models"
    else:
        status = next((code for cls, code in _STATUS.items() if isinstance(exc, cls)), 500)
        message = str(exc) or type(exc).__name__
    if status == 499:
        log.info("%s", message)
    if status == 500:
        log.error("%s %s failed: %s", request.method, request.url.path, message, exc_info=exc)
    # A full queue drains as the requests ahead finish; a second is as long as a client should wait to ask again.
    headers = {"Retry-After": "1"} if status == 503 else None
    return Response(error_body(request.url.path, status, message), status_code=status, headers=headers)


def create_app(store: Store, registry: Registry) -> Litestar:
    services = Services(store=store, registry=registry, scheduler=Scheduler(registry))
    if not registry.architectures():
        log.warning("no architecture plugin is installed: models can be pulled and listed, not created or run")
    app = Litestar(
        route_handlers=ollama.ROUTES + ollama_generate.ROUTES + ollama_registry.ROUTES + openai.ROUTES
        + openai_responses.ROUTES + anthropic.ROUTES,
        state=State({"services": services}),
        exception_handlers={Exception: _error_response},
        request_max_body_size=MAX_REQUEST_BYTES,
        cors_config=cors_config(),
        on_shutdown=[services.scheduler.shutdown],
        logging_config=None,
    )
    describe_bodies_and_errors(app)
    return app
