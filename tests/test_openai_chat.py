"""End to end: /v1/chat/completions on a live `plugd serve`, driven by the official `openai` client (random tiny model)."""

import base64
import io
import json
import os
import signal

import httpx
import numpy as np
import openai
import pytest
from PIL import Image


def png(size, noise=False):
    shape = (size, size, 3)
    pixels = np.random.default_rng(0).integers(0, 256, shape, np.uint8) if noise else np.zeros(shape, np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


HI = [{"role": "user", "content": "Hi"}]
GREEDY = {"temperature": 0}
PNG = png(1)
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def chat(client, messages=HI, **fields):
    return client.chat.completions.create(model="tiny", messages=messages, **(GREEDY | fields))


def bad_request(call) -> str:
    with pytest.raises(openai.BadRequestError) as err:
        call()
    assert err.value.status_code == 400 and err.value.body["type"] == "invalid_request_error"
    return err.value.body["message"]


def test_streaming_and_non_streaming_agree(client):
    whole = chat(client, max_tokens=8)
    assert whole.id.startswith("chatcmpl-") and whole.object == "chat.completion" and whole.model == "tiny"
    (choice,) = whole.choices
    assert choice.finish_reason == "length" and choice.message.role == "assistant" and choice.logprobs is None
    assert whole.usage.completion_tokens == 8
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 8

    chunks = list(chat(client, max_tokens=8, stream=True))
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks[-1:]] == ["length"]
    assert all(c.usage is None for c in chunks)


def test_include_usage_adds_a_usage_chunk_with_no_choices(client):
    *chunks, last = chat(client, max_tokens=4, stream=True, stream_options={"include_usage": True})
    assert last.choices == [] and last.usage.completion_tokens == 4
    assert chunks[-1].choices[0].finish_reason == "length"


def test_repeated_prompt_reports_cached_tokens(client):
    messages = [{"role": "user", "content": "Tell me about caches, please."}]
    first = chat(client, messages, max_tokens=2).usage
    second = chat(client, messages, max_tokens=2).usage
    assert second.prompt_tokens == first.prompt_tokens
    assert 0 < second.prompt_tokens_details.cached_tokens < second.prompt_tokens


def test_max_tokens_stop_and_seed(client):
    assert chat(client, max_completion_tokens=3, max_tokens=9).usage.completion_tokens == 3
    full = chat(client, max_tokens=20).choices[0].message.content
    stop = full[5:8]
    assert stop and stop not in full[:5], "pick a stop string that first appears at offset 5"
    stopped = chat(client, max_tokens=20, stop=stop).choices[0]
    assert stopped.message.content == full[:5] and stopped.finish_reason == "stop"
    assert chat(client, max_tokens=20, stop=[stop, "never"]).choices[0].message.content == full[:5]

    def sample(seed):
        return chat(client, max_tokens=16, temperature=1.5, seed=seed).choices[0].message.content

    assert sample(7) == sample(7)
    assert len({sample(7), sample(8), sample(9)}) > 1


def test_logprobs_non_streaming_and_streaming(client):
    choice = chat(client, max_tokens=6, logprobs=True, top_logprobs=3).choices[0]
    tokens = choice.logprobs.content
    assert len(tokens) == 6
    for token in tokens:
        assert token.bytes == list(token.token.encode()) and token.logprob <= 0
        assert len(token.top_logprobs) == 3
        assert (token.top_logprobs[0].token, token.top_logprobs[0].logprob) == (token.token, token.logprob)  # greedy
    streamed = [t for c in chat(client, max_tokens=6, logprobs=True, stream=True) if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    assert [(t.token, t.top_logprobs) for t in streamed] == [(t.token, []) for t in tokens]
    assert "top_logprobs needs logprobs" in bad_request(lambda: chat(client, top_logprobs=2))
    assert "between 0 and 20" in bad_request(lambda: chat(client, logprobs=True, top_logprobs=21))


def test_reasoning_effort_turns_thinking_off_or_on(client):
    plain = chat(client, max_tokens=1).usage.prompt_tokens
    # The tiny template writes an empty think block into the prompt when thinking is off.
    assert chat(client, max_tokens=1, reasoning_effort="none").usage.prompt_tokens > plain
    assert chat(client, max_tokens=1, reasoning_effort="minimal").usage.prompt_tokens > plain
    assert chat(client, max_tokens=1, reasoning_effort="high").usage.prompt_tokens == plain
    assert "reasoning_effort 'extreme'" in bad_request(lambda: chat(client, reasoning_effort="extreme"))


def test_history_with_tool_calls_results_and_reasoning(client):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = HI + [{"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'}]
    with_tools = chat(client, history, tools=[WEATHER_TOOL], max_tokens=1).usage.prompt_tokens
    assert with_tools > chat(client, max_tokens=1).usage.prompt_tokens
    parts = history[:2] + [{"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "18"}]}]
    assert chat(client, parts, tools=[WEATHER_TOOL], max_tokens=1).choices[0].finish_reason == "length"
    answer = {"role": "assistant", "content": "Hello"}
    with_reasoning = HI + [answer | {"reasoning_content": "The user greets me."}] + HI
    assert chat(client, with_reasoning, max_tokens=1).usage.prompt_tokens > chat(client, HI + [answer] + HI,
                                                                              max_tokens=1).usage.prompt_tokens

    unmatched = history[:2] + [{"role": "tool", "tool_call_id": "call_9", "content": "x"}]
    assert "tool result 'call_9' answers no earlier tool call" in bad_request(lambda: chat(client, unmatched))
    no_call = HI + [{"role": "tool", "tool_call_id": "call_1", "content": "x"}]
    assert "answers no earlier tool call" in bad_request(lambda: chat(client, no_call))
    broken = dict(call, function={"name": "get_weather", "arguments": "{city: Paris"})
    message = bad_request(lambda: chat(client, HI + [{"role": "assistant", "tool_calls": [broken]}]))
    assert "messages[1].tool_calls[0].function.arguments is not valid JSON" in message
    listed = dict(call, function={"name": "get_weather", "arguments": "[1]"})
    assert "must be an object" in bad_request(lambda: chat(client, HI + [{"role": "assistant", "tool_calls": [listed]}]))


@pytest.mark.parametrize("messages, expected", [
    ([{"role": "wizard", "content": "x"}], "invalid message role 'wizard'"),
    ([{"role": "function", "name": "f", "content": "x"}], "legacy 'function' role"),
    ([], "messages must be a non-empty list"),
    (["hello"], "messages[0] must be an object"),
    ([{"role": "user", "content": 7}], "messages[0].content must be a string or a list"),
    ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], "'input_audio' is not supported"),
    ([{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "'image_url' is not supported"),
])
def test_malformed_messages_are_refused(client, messages, expected):
    assert expected in bad_request(lambda: chat(client, messages))


def image_message(url):
    return [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                          {"type": "image_url", "image_url": {"url": url}}]}]


@pytest.mark.parametrize("url, expected", [
    ("data:image/png;base64," + base64.b64encode(PNG).decode(), "does not support images"),  # decoded, then refused
    ("data:image/png;base64," + base64.b64encode(b"not an image at all").decode(), "data is not an image"),
    ("data:image/jpeg;base64," + base64.b64encode(PNG).decode(), "declared as image/jpeg but its bytes are image/png"),
    ("data:image/png;base64,%%%not-base64", "not valid base64"),
    ("data:image/png,rawbytes", "only base64 data: URLs are supported"),
    ("https://example.com/cat.png", "does not fetch remote URLs"),
])
def test_images_are_decoded_from_data_urls_only(client, url, expected):
    assert expected in bad_request(lambda: chat(client, image_message(url)))


def test_a_large_inline_image_fits_in_the_body_limit(client):
    photo = png(2048, noise=True)  # 12 MiB: past Litestar's default 10 MB limit once base64-encoded
    url = "data:image/png;base64," + base64.b64encode(photo).decode()
    assert "does not support images" in bad_request(lambda: chat(client, image_message(url)))


@pytest.mark.parametrize("tool, expected", [
    ({"type": "function", "function": {"description": "no name"}}, "tools[0].function.name must be a string"),
    ({"type": "function", "function": {"name": "get weather"}}, "invalid tool name 'get weather'"),
    ({"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}, "JSON Schema of type object"),
    ({"type": "function", "function": {"name": "f", "parameters": "{}"}}, "parameters must be an object"),
    ({"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": []}}},
     "JSON Schema of type object"),
    ({"type": "custom", "custom": {"name": "f"}}, "tool type 'custom' is not supported"),
    ({"type": "function"}, "tools[0].function must be an object"),
])
def test_malformed_tools_are_refused(client, tool, expected):
    assert expected in bad_request(lambda: chat(client, tools=[tool]))


def test_tool_choice_is_passed_to_the_pipeline(client):
    assert chat(client, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=2).choices[0].finish_reason == "length"
    assert chat(client, tools=[WEATHER_TOOL], tool_choice="auto", max_tokens=2).choices[0].finish_reason == "length"
    # Without a grammar engine the pipeline refuses to promise a tool call.
    assert "tool_choice 'required'" in bad_request(lambda: chat(client, tools=[WEATHER_TOOL], tool_choice="required"))
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert "tool_choice 'named'" in bad_request(lambda: chat(client, tools=[WEATHER_TOOL], tool_choice=named))
    assert "needs tools" in bad_request(lambda: chat(client, tool_choice="required"))
    assert "tool_choice 'sometimes'" in bad_request(lambda: chat(client, tools=[WEATHER_TOOL], tool_choice="sometimes"))
    assert "tool names must be unique" in bad_request(lambda: chat(client, tools=[WEATHER_TOOL, WEATHER_TOOL]))


def test_response_format_is_enforced(client):
    assert chat(client, response_format={"type": "text"}, max_tokens=2).choices[0].finish_reason == "length"
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False}
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": schema}}
    reply = chat(client, response_format=response_format, max_tokens=32).choices[0]
    assert reply.finish_reason == "stop" and json.loads(reply.message.content) in ({"answer": "yes"}, {"answer": "no"})
    assert chat(client, response_format={"type": "json_object"}, max_tokens=4).choices[0].message.content[0] == "{"
    assert "response_format type 'yaml'" in bad_request(lambda: chat(client, response_format={"type": "yaml"}))
    not_a_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": "object"}}
    assert "schema must be an object" in bad_request(lambda: chat(client, response_format=not_a_schema))


@pytest.mark.parametrize("fields, expected", [
    ({"n": 2}, "n > 1 is not supported"),
    ({"logit_bias": {"42": 10}}, "logit_bias"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"store": True}, "store"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"max_tokens": 0}, "max_tokens must be at least 1"),
    ({"temperature": "hot"}, "temperature"),
])
def test_fields_that_change_semantics_are_refused(client, fields, expected):
    assert expected in bad_request(lambda: chat(client, **fields))


def test_harmless_fields_are_ignored(client):
    response = chat(client, max_tokens=2, user="me", metadata={"k": "v"}, store=False, service_tier="auto",
                    parallel_tool_calls=True, logit_bias={}, n=1, modalities=["text"], prompt_cache_key="k",
                    safety_identifier="s", extra_body={"something_new": 1})
    assert response.usage.completion_tokens == 2


def test_errors_in_openai_shape(client, server):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=HI)
    assert missing.value.status_code == 404 and "model 'no-such-model:latest' not found" in missing.value.message
    assert missing.value.body["type"] == "not_found_error" and missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad_name:
        client.chat.completions.create(model="../../etc", messages=HI)
    assert "invalid model name" in bad_name.value.message and bad_name.value.code == "invalid_name"
    for body in (b"{not json", b"\xff\xfe", b"[1, 2]", b'{"messages": []}'):
        response = httpx.post(server.url + "/v1/chat/completions", content=body)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"]


def test_runner_failure_mid_stream_is_an_error_event(server, client):
    stream = chat(client, [{"role": "user", "content": "Tell me everything"}], stream=True)
    next(stream)
    (pid,) = server.runner_pids()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(openai.APIError) as err:
        for _ in stream:
            pass
    assert "killed by signal 9" in err.value.message
    assert err.value.body["type"] == "server_error"
    assert chat(client, max_tokens=2).usage.completion_tokens == 2  # the next request loads the model again
