"""Settings read from the environment, shared by the daemon and the CLI."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

DEFAULT_PORT = 11434


def daemon_address() -> tuple[str, int]:
    """Host and port from PLUGD_HOST (default 127.0.0.1:11434), read the way Ollama reads OLLAMA_HOST.

    Accepts `host`, `host:port`, `:port`, `[::1]:port` and `http://host:port`.
    """
    value = os.environ.get("PLUGD_HOST", "").strip() or "127.0.0.1"
    if "://" not in value:
        value = "http://" + value
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"invalid PLUGD_HOST {os.environ.get('PLUGD_HOST')!r}: bad port") from None
    return parts.hostname or "127.0.0.1", port if port is not None else DEFAULT_PORT


def daemon_url() -> str:
    host, port = daemon_address()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def client_renderer_names() -> list[str]:
    """The client renderer plugins the user enabled, from PLUGD_CLIENT_RENDERERS (comma-separated names)."""
    return [name.strip() for name in os.environ.get("PLUGD_CLIENT_RENDERERS", "").split(",") if name.strip()]
