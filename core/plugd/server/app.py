"""The Litestar application: a router per dialect, each answering its routes' failures in the dialect's error
shape, and the Services (store, registry, scheduler, settings) every handler is given as a dependency."""

from __future__ import annotations

import logging
from typing import Any

from litestar import Litestar, Request, Response, Router
from litestar.di import Provide

from plugd.chat.pipeline import Services
from plugd.plugins import Registry
from plugd.scheduler.scheduler import Scheduler
from plugd.server import (
    anthropic,
    ollama,
    ollama_embed,
    ollama_generate,
    ollama_registry,
    openai,
    openai_embeddings,
    openai_responses,
)
from plugd.server.cors import cors_config
from plugd.server.errors import Dialect, dialect_of, failure_body
from plugd.server.openapi import describe_bodies_and_errors
from plugd.settings import Settings
from plugd.store.store import Store

log = logging.getLogger(__name__)

# Room for a conversation with several large base64 images; blob uploads (any size) stream past this limit.
MAX_REQUEST_BYTES = 64 << 20


def _error_response(dialect: Dialect, request: Request, exc: Exception) -> Response[Any]:
    status, body = failure_body(dialect, request.url.path, exc)
    if status == 499:
        log.info("%s", exc)
    if status == 500:
        log.error("%s %s failed: %s", request.method, request.url.path, exc, exc_info=exc)
    # A full queue drains as the requests ahead finish; a second is as long as a client should wait to ask again.
    headers = {"Retry-After": "1"} if status == 503 else None
    return Response(body, status_code=status, headers=headers)


def _dialect(dialect: Dialect, routes: list[Any]) -> Router:
    return Router(path="/", route_handlers=routes,
                  exception_handlers={Exception: lambda request, exc: _error_response(dialect, request, exc)})


def _unrouted(request: Request, exc: Exception) -> Response[Any]:
    """A failure before any route took the request (no route has its path or method): in the shape of the
    dialect whose routes the path looks like."""
    return _error_response(dialect_of(request.url.path), request, exc)


def create_app(store: Store, registry: Registry, settings: Settings | None = None) -> Litestar:
    settings = settings or Settings.from_environment()
    services = Services(store=store, registry=registry, scheduler=Scheduler(registry, settings), settings=settings)
    if not registry.architectures():
        log.warning("no architecture plugin is installed: models can be pulled and listed, not created or run")
    app = Litestar(
        route_handlers=[
            _dialect("ollama", ollama.ROUTES + ollama_generate.ROUTES + ollama_registry.ROUTES + ollama_embed.ROUTES),
            _dialect("openai", openai.ROUTES + openai_responses.ROUTES + openai_embeddings.ROUTES),
            _dialect("anthropic", anthropic.ROUTES),
        ],
        dependencies={"services": Provide(lambda: services, use_cache=True, sync_to_thread=False)},
        exception_handlers={Exception: _unrouted},
        request_max_body_size=MAX_REQUEST_BYTES,
        cors_config=cors_config(settings.origins),
        on_shutdown=[services.scheduler.shutdown],
        logging_config=None,
    )
    describe_bodies_and_errors(app)
    return app
