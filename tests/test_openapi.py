"""The OpenAPI document a live daemon serves describes what its endpoints take and how they fail: real request
bodies validate against each operation's requestBody schema, and real errors against the error shapes it lists."""

import httpx
import jsonschema
import pytest

# Every route that reads a JSON body.
BODIES = [("post", "/api/show"), ("post", "/api/verify"), ("post", "/api/copy"), ("delete", "/api/delete"),
          ("post", "/api/create"), ("post", "/api/generate"), ("post", "/api/chat"), ("post", "/api/pull"),
          ("post", "/api/push"), ("post", "/v1/chat/completions"), ("post", "/v1/completions"),
          ("post", "/v1/responses"), ("post", "/v1/messages"), ("post", "/v1/messages/count_tokens")]


@pytest.fixture(scope="module")
def server(plugd_server_factory):
    return plugd_server_factory()


@pytest.fixture(scope="module")
def document(server):
    response = httpx.get(f"{server.url}/schema/openapi.json")
    assert response.status_code == 200
    return response.json()


def body_schema(document, method, path):
    return document["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]


def test_every_route_that_reads_a_body_documents_it(document):
    for method, path in BODIES:
        assert document["paths"][path][method]["requestBody"]["required"] is True, (method, path)


@pytest.mark.parametrize("path, body", [
    ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": "hi", "images": ["aGk="]},
                                              {"role": "assistant", "content": "", "tool_calls": [
                                                  {"function": {"name": "f", "arguments": {"x": 1}}}]}],
                   "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                               "parameters": {"type": "object"}}}],
                   "think": "high", "keep_alive": "5m", "options": {"num_ctx": 8192}, "stream": False}),
    ("/api/generate", {"model": "m", "prompt": "hi", "raw": True, "images": [], "format": {"type": "object"}}),
    ("/api/create", {"model": "m", "from": "base", "files": {"config.json": "sha256:" + "0" * 64},
                     "parameters": {"temperature": 0.5}, "license": ["MIT"]}),
    ("/v1/messages", {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
                      "system": [{"type": "text", "text": "Be brief."}], "stream": True}),
    ("/v1/responses", {"model": "m", "input": "hi", "tools": [{"type": "web_search"}], "reasoning": {"effort": "low"}}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                              "stream_options": {"include_usage": True}, "max_tokens": 5, "temperature": 0.2,
                              "response_format": {"type": "json_object"}}),
])
def test_real_bodies_validate_against_their_schemas(document, path, body):
    jsonschema.validate(body, body_schema(document, "post", path))


@pytest.mark.parametrize("path, body", [("/api/chat", {"model": 5}), ("/v1/messages", {"model": "m"})])
def test_a_wrong_body_fails_its_schema_and_the_endpoint_alike(server, document, path, body):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, body_schema(document, "post", path))
    assert httpx.post(server.url + path, json=body).status_code == 400


@pytest.mark.parametrize("path, body, status", [
    ("/api/chat", {"model": "absent", "messages": []}, "404"),
    ("/api/show", {}, "400"),
    ("/v1/chat/completions", {"model": "absent", "messages": [{"role": "user", "content": "hi"}]}, "404"),
    ("/v1/messages", {"model": "absent", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}, "404"),
    ("/v1/responses", {"model": "absent", "input": "hi"}, "404"),
])
def test_real_errors_have_the_documented_shape(server, document, path, body, status):
    response = httpx.post(server.url + path, json=body)
    assert str(response.status_code) == status
    documented = document["paths"][path]["post"]["responses"][status]["content"]["application/json"]["schema"]
    jsonschema.validate(response.json(), documented)
    assert not any(code.startswith("4") and code not in ("400", "404")
                   for code in document["paths"][path]["post"]["responses"])  # no Litestar default shape left
