"""Malformed bodies a fuzz run found answered with 500s: each is a 400 in the dialect's own error shape, from a
live daemon with a real model, and the daemon answers normally afterwards."""

import json

import httpx
import pytest

MODEL = "m"
DEEP = "[" * 1000 + "]" * 1000


@pytest.fixture(scope="module")
def server(plugd_server_factory, tiny_checkpoint, tmp_path_factory):
    server = plugd_server_factory()
    modelfile = tmp_path_factory.mktemp("modelfile") / "Modelfile"
    modelfile.write_text(f"FROM {tiny_checkpoint('qwen3')}\nPARAMETER num_predict 2\n")
    assert server.cli("create", MODEL, "-f", str(modelfile)).returncode == 0
    return server


def chat(path, content="hi", **fields):
    """A chat request for `path`'s dialect, as JSON text (Python's json writes NaN, Infinity and lone surrogates)."""
    messages = [{"role": "user", "content": content}]
    if path == "/api/chat":
        body = {"model": MODEL, "messages": messages, "stream": False, "options": fields}
    elif path == "/v1/messages":
        body = {"model": MODEL, "max_tokens": 2, "messages": messages, **fields}
    else:
        body = {"model": MODEL, "messages": messages, **fields}
    return json.dumps(body)


def error_message(path, response):
    body = response.json()
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        return body["error"]["message"]
    if path.startswith("/v1/"):
        assert body["error"]["type"] == "invalid_request_error"
        return body["error"]["message"]
    return body["error"]


DIALECTS = ["/api/chat", "/api/generate", "/api/show", "/api/create", "/api/pull", "/v1/chat/completions", "/v1/completions",
            "/v1/responses", "/v1/messages"]


@pytest.mark.parametrize("path", DIALECTS)
def test_json_nested_a_thousand_deep(server, path):
    response = httpx.post(server.url + path, content=DEEP, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert error_message(path, response) == "invalid JSON body: nested too deeply"


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions", "/v1/messages"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers(server, path, value):
    response = httpx.post(server.url + path, content=chat(path, temperature=value),
                          headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert error_message(path, response).endswith("is not a JSON number")


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions", "/v1/messages"])
def test_lone_surrogates(server, path):
    response = httpx.post(server.url + path, content=chat(path, content="a \ud800 b"),
                          headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert "lone UTF-16 surrogate" in error_message(path, response)
    # A surrogate pair is one character, and fine.
    paired = httpx.post(server.url + path, content=chat(path, content="a \U0001f642 b"),
                        headers={"content-type": "application/json"}, timeout=60)
    assert paired.status_code == 200, paired.text


@pytest.mark.parametrize("option, value, wording", [
    ("seed", 2**64, "seed must be at most 18446744073709551615"),
    ("repeat_last_n", 10**11, "repeat_last_n must be between -1 and 2147483647"),
    ("num_predict", 10**11, "num_predict must be at most 2147483647"),
    ("top_k", 10**11, "top_k must be between 0 and 2147483647"),
])
def test_options_out_of_range(server, option, value, wording):
    response = httpx.post(server.url + "/api/chat", content=chat("/api/chat", **{option: value}))
    assert response.status_code == 400 and wording in error_message("/api/chat", response)


def test_a_seed_of_64_bits_and_a_negative_one_are_fine(server):
    for seed in (2**64 - 1, -1):
        response = httpx.post(server.url + "/api/chat", content=chat("/api/chat", seed=seed), timeout=60)
        assert response.status_code == 200, response.text
