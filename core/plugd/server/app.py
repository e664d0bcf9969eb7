"""The Litestar application: routes from each dialect module, shared state, and Ollama-shaped errors."""

from __future__ import annotations

import logging
from typing import Any

from litestar import Litestar, Request, Response
from litestar.datastructures import State
from litestar.exceptions import HTTPException

from plugd.plugins import Registry
from plugd.server import ollama
from plugd.server.bodies import BadRequest
from plugd.store.blobs import DigestMismatch, InvalidDigest
from plugd.store.create import CreateError
from plugd.store.model_files import MalformedModelFile
from plugd.store.names import InvalidName
from plugd.store.store import CorruptModel, ModelNotFound, Store

log = logging.getLogger(__name__)


_STATUS = {
    BadRequest: 400,
    InvalidName: 400,
    InvalidDigest: 400,
    DigestMismatch: 400,
    CreateError: 400,
    ModelNotFound: 404,
    CorruptModel: 500,
    MalformedModelFile: 500,
}


def _error_response(request: Request, exc: Exception) -> Response[Any]:
    if isinstance(exc, HTTPException):
        status, message = exc.status_code, exc.detail
    else:
        status = next((code for cls, code in _STATUS.items() if isinstance(exc, cls)), 500)
        message = str(exc) or type(exc).__name__
    if status >= 500:
        log.error("%s %s failed: %s", request.method, request.url.path, message, exc_info=exc)
    return Response({"error": message}, status_code=status)


def create_app(store: Store, registry: Registry) -> Litestar:
    return Litestar(
        route_handlers=ollama.ROUTES,
        state=State({"store": store, "registry": registry}),
        exception_handlers={Exception: _error_response},
        on_startup=[lambda: _startup(store, registry)],
        logging_config=None,
    )


def _startup(store: Store, registry: Registry) -> None:
    if not registry.architectures():
        log.warning("no architecture plugin is installed: models can be stored but not run")
