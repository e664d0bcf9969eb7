"""What a browser may do with a daemon on loopback, as Ollama allows it: call the API from the pages Ollama lets
through (this machine's, apps' and editors' webviews) and those PLUGD_ORIGINS adds, other pages refused before
their request runs; and reach it only under a local host name, so that a page rebinding its own domain to 127.0.0.1 is
refused."""

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


@pytest.mark.parametrize("origin", ["https://evil.example.com", "http://localhost.evil.com", "https://example.org",
                                    "null"])
def test_other_origins_are_refused_before_routing(server, origin):
    response = httpx.get(f"{server.url}/api/tags", headers={"Origin": origin})
    assert response.status_code == 403 and ALLOW not in response.headers
    assert response.json() == {"error": f"origin {origin!r} is not allowed: set PLUGD_ORIGINS to let a web page "
                                        "call plugd"}
    preflight = httpx.options(f"{server.url}/api/chat", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 403 and ALLOW not in preflight.headers


def test_a_cross_site_simple_post_changes_nothing(server):
    """A page can send a POST with Content-Type text/plain and no preflight: it is refused, not run."""
    created = httpx.post(f"{server.url}/api/copy", headers={"Origin": "https://evil.example.com",
                                                               "Content-Type": "text/plain"},
                         content='{"source": "a", "destination": "b"}')
    assert created.status_code == 403
    for path, dialect_error in [("/v1/chat/completions", lambda body: body["error"]["type"] == "permission_error"),
                                ("/v1/messages", lambda body: body["error"]["type"] == "permission_error"
                                 and body["type"] == "error"),
                                ("/api/delete", lambda body: "is not allowed" in body["error"])]:
        response = httpx.post(f"{server.url}{path}", headers={"Origin": "https://evil.example.com",
                                                              "Content-Type": "text/plain"}, content="{}")
        assert response.status_code == 403 and dialect_error(response.json()), (path, response.text)
    # The same request from no page at all is routed (and fails for its own reason).
    assert httpx.post(f"{server.url}/api/copy", json={"source": "a", "destination": "b"}).status_code == 404


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]", "10.1.2.3", "box.local", "app.localhost"])
def test_local_host_names_are_answered(server, host):
    assert httpx.get(f"{server.url}/api/tags", headers={"Host": f"{host}:11434"}).status_code == 200


@pytest.mark.parametrize("host", ["evil.example.com", "8.8.8.8", "localhost.evil.com"])
def test_other_host_names_are_refused(server, host):
    response = httpx.request("DELETE", f"{server.url}/api/delete", headers={"Host": host}, json={"model": "x"})
    assert response.status_code == 403
    assert response.json()["error"].startswith(f"host '{host}' is not allowed: plugd listens on loopback")
