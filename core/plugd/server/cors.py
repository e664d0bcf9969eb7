"""Which web pages may call the API from a browser: Ollama's default origins (pages served from this machine on
any port, desktop apps' and editors' webviews) and those PLUGD_ORIGINS adds, with `*` as a wildcard."""

from __future__ import annotations

import os

from litestar.config.cors import CORSConfig

LOCAL_HOSTS = ("localhost", "127.0.0.1", "0.0.0.0")
APP_SCHEMES = ("app", "file", "tauri", "vscode-webview", "vscode-file")


def allowed_origins() -> list[str]:
    added = [origin.strip() for origin in os.environ.get("PLUGD_ORIGINS", "").split(",") if origin.strip()]
    local = [f"{scheme}://{host}{port}" for host in LOCAL_HOSTS for scheme in ("http", "https") for port in ("", ":*")]
    return added + local + [f"{scheme}://*" for scheme in APP_SCHEMES]


def cors_config() -> CORSConfig:
    return CORSConfig(allow_origins=allowed_origins(), allow_methods=["*"], allow_headers=["*"])
