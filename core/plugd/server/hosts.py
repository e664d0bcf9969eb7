"""A daemon listening on loopback answers only requests that name a local host: a web page that points its own
domain at 127.0.0.1 (DNS rebinding) still sends that domain in Host, and gets a 403. Ollama's rule."""

from __future__ import annotations

import ipaddress
import socket

from litestar.types import ASGIApp, Receive, Scope, Send

from plugd.server.errors import send_error

LOCAL_SUFFIXES = (".localhost", ".local", ".internal")


def allowed_host(host: str) -> bool:
    """Whether a request whose Host header names `host` (its port stripped) may reach a daemon on loopback."""
    name = host.lower()
    try:
        address = ipaddress.ip_address(name.removeprefix("[").removesuffix("]"))
    except ValueError:
        return name in ("", "localhost", socket.gethostname().lower()) or name.endswith(LOCAL_SUFFIXES)
    return address.is_loopback or address.is_private or address.is_unspecified


def _host_of(scope: Scope) -> str:
    value = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
    if value.startswith("["):
        return value.partition("]")[0] + "]"
    return value.rpartition(":")[0] if value.count(":") == 1 else value


def loopback_host_guard(app: ASGIApp) -> ASGIApp:
    """The app, with HTTP requests naming a host that is not local refused before they reach it."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not allowed_host(host := _host_of(scope)):
            await send_error(send, scope["path"], 403, f"host {host!r} is not allowed: plugd listens on loopback and "
                                                       "answers requests to local host names only")
            return
        await app(scope, receive, send)

    return guarded
