"""Which web pages may call the API from a browser: Ollama's default origins (pages served from this machine on
any port, desktop apps' and editors' webviews) and those PLUGD_ORIGINS adds, with `*` as a wildcard.

A request from any other page is refused before routing, whatever its method and content type: CORS alone only
hides the answer from the page, and a "simple" cross-origin POST (text/plain, no preflight) would still run."""

from __future__ import annotations

from litestar.config.cors import CORSConfig
from litestar.types import ASGIApp, Receive, Scope, Send

from plugd.server.errors import send_error

LOCAL_HOSTS = ("localhost", "127.0.0.1", "0.0.0.0")
APP_SCHEMES = ("app", "file", "tauri", "vscode-webview", "vscode-file")


def allowed_origins(added: tuple[str, ...] = ()) -> list[str]:
    """Ollama's default origins, and `added` (PLUGD_ORIGINS)."""
    local = [f"{scheme}://{host}{port}" for host in LOCAL_HOSTS for scheme in ("http", "https") for port in ("", ":*")]
    return [*added, *local, *(f"{scheme}://*" for scheme in APP_SCHEMES)]


def cors_config(added: tuple[str, ...] = ()) -> CORSConfig:
    return CORSConfig(allow_origins=allowed_origins(added), allow_methods=["*"], allow_headers=["*"])


def origin_guard(app: ASGIApp, config: CORSConfig) -> ASGIApp:
    """The app, with HTTP requests whose Origin header names a page `config` does not allow refused with a 403.
    Requests without an Origin (every non-browser client) pass."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            origin = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"origin"), None)
            if origin is not None and not config.is_origin_allowed(origin):
                await send_error(send, scope["path"], 403, f"origin {origin!r} is not allowed: set PLUGD_ORIGINS to "
                                                           "let a web page call plugd")
                return
        await app(scope, receive, send)

    return guarded
