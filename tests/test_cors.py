"""Browsers may call the API from the pages Ollama lets through (this machine's, apps' and editors' webviews) and
from those PLUGD_ORIGINS adds; other pages get no CORS grant."""

import httpx
import pytest

ALLOW = "access-control-allow-origin"


@pytest.fixture(scope="module")
def server(plugd_server_factory):
    return plugd_server_factory(env={"PLUGD_ORIGINS": "https://chat.example.org,https://*.example.net"})


@pytest.mark.parametrize("origin", ["http://localhost:3000", "http://127.0.0.1", "https://0.0.0.0:8443",
                                    "vscode-webview://1abc", "tauri://localhost", "https://chat.example.org",
                                    "https://team.example.net"])
def test_allowed_origins_get_a_preflight_and_a_grant(server, origin):
    preflight = httpx.options(f"{server.url}/api/chat", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert preflight.status_code in (200, 204) and preflight.headers[ALLOW] == origin
    assert httpx.get(f"{server.url}/api/tags", headers={"Origin": origin}).headers[ALLOW] == origin


@pytest.mark.parametrize("origin", ["https://evil.example.com", "http://localhost.evil.com", "https://example.org"])
def test_other_origins_get_no_grant(server, origin):
    response = httpx.get(f"{server.url}/api/tags", headers={"Origin": origin})
    assert response.status_code == 200 and ALLOW not in response.headers
    preflight = httpx.options(f"{server.url}/api/chat", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
    assert ALLOW not in preflight.headers
