"""End to end: /v1/completions and /v1/models on a live `plugd serve`, driven by the official `openai` client."""

from datetime import datetime

import httpx
import openai
import pytest

GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def complete(client, prompt="Once upon a time", **fields):
    return client.completions.create(model="tiny", prompt=prompt, **(GREEDY | fields))


def bad_request(call) -> str:
    with pytest.raises(openai.BadRequestError) as err:
        call()
    assert err.value.body["type"] == "invalid_request_error"
    return err.value.body["message"]


def test_completion_is_the_raw_prompt_continued(client, server):
    whole = complete(client, max_tokens=8)
    assert whole.id.startswith("cmpl-") and whole.object == "text_completion" and whole.model == "tiny"
    (choice,) = whole.choices
    assert choice.finish_reason == "length" and choice.logprobs is None
    assert whole.usage.completion_tokens == 8
    # No chat template: the same text Ollama's raw generate gives.
    ollama = httpx.post(server.url + "/api/generate", json={
        "model": "tiny", "prompt": "Once upon a time", "raw": True, "stream": False,
        "options": {"temperature": 0, "num_predict": 8}}, timeout=60).json()
    assert choice.text == ollama["response"]

    *chunks, usage = complete(client, max_tokens=8, stream=True, stream_options={"include_usage": True})
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert usage.choices == [] and usage.usage.completion_tokens == 8
    assert complete(client, prompt=["Once upon a time"], max_tokens=8).choices[0].text == choice.text


def test_stop_strings(client):
    full = complete(client, max_tokens=20).choices[0].text
    stop = full[5:8]
    assert stop and stop not in full[:5], "pick a stop string that first appears at offset 5"
    stopped = complete(client, max_tokens=20, stop=stop).choices[0]
    assert (stopped.text, stopped.finish_reason) == (full[:5], "stop")


def test_logprobs(client):
    choice = complete(client, max_tokens=5, logprobs=2).choices[0]
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
    offsets = [0]
    for token in logprobs.tokens[:-1]:
        offsets.append(offsets[-1] + len(token))
    assert logprobs.text_offset == offsets
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert 1 <= len(top) <= 2 and top[token] == logprob == max(top.values())  # greedy picks the likeliest
    streamed = [t for c in complete(client, max_tokens=5, logprobs=0, stream=True) if c.choices[0].logprobs
                for t in c.choices[0].logprobs.tokens]
    assert streamed == logprobs.tokens


@pytest.mark.parametrize("fields, expected", [
    ({"suffix": "the end"}, "suffix is not supported"),
    ({"echo": True}, "echo is not supported"),
    ({"prompt": ["one", "two"]}, "exactly one string"),
    ({"prompt": ""}, "prompt must not be empty"),
    ({"prompt": [[1, 2, 3]]}, "prompt"),
    ({"best_of": 3}, "best_of"),
    ({"n": 2}, "n > 1 is not supported"),
    ({"logprobs": 50}, "between 0 and 20"),
])
def test_unsupported_requests_are_refused(client, fields, expected):
    assert expected in bad_request(lambda: complete(client, **fields))


def test_models_list_and_retrieve(client, server):
    assert server.cli("cp", "tiny", "me/tiny:v2").returncode == 0
    models = {m.id: m for m in client.models.list()}
    assert set(models) == {"tiny:latest", "me/tiny:v2"}
    assert models["tiny:latest"].owned_by == "library" and models["me/tiny:v2"].owned_by == "me"
    assert all(m.object == "model" for m in models.values())
    tags = {m["name"]: m for m in httpx.get(server.url + "/api/tags").json()["models"]}
    for name, model in models.items():
        assert model.created == int(datetime.fromisoformat(tags[name]["modified_at"]).timestamp())

    assert client.models.retrieve("tiny") == models["tiny:latest"]
    assert client.models.retrieve("me/tiny:v2") == models["me/tiny:v2"]
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("me/absent:v1")
    assert missing.value.body["message"] == "model 'me/absent:v1' not found"
    assert "invalid model name" in bad_request(lambda: client.models.retrieve("a/b/c/d"))
