"""End to end: /v1/messages and /v1/messages/count_tokens on a real daemon, driven by the official `anthropic` client.

A random tiny model answers here: its words mean nothing, but they are
deterministic under greedy decoding, so the same conversation sent through the
Ollama dialect must get the same answer.
"""

import base64
import io
import json
import os
import signal

import anthropic
import httpx
import ollama
import pytest
from PIL import Image

from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.server import LiveServer

GREEDY = {"temperature": 0}
HELLO = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("anthropic")
    checkpoint = write_checkpoint(root / "tiny", "qwen3", seed=0)
    live = LiveServer(root / "models")
    try:
        created = live.cli("create", "tiny", "--from", str(checkpoint))
        assert created.returncode == 0, created.stderr
        yield live
    finally:
        live.stop()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def create(client, messages=HELLO, max_tokens=12, **fields):
    """A greedy message; temperature is no longer a typed argument of the SDK, so it goes in extra_body."""
    return client.messages.create(model="tiny", max_tokens=max_tokens, messages=messages, extra_body=GREEDY, **fields)


def text_of(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_whole_and_streamed_messages_agree(client):
    whole = create(client)
    assert whole.id.startswith("msg_") and whole.type == "message" and whole.role == "assistant"
    assert whole.model == "tiny"
    assert [block.type for block in whole.content] == ["text"] and whole.content[0].text
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.stop_sequence is None
    assert 0 < whole.usage.output_tokens <= 12
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens > 0
    assert whole.usage.cache_creation_input_tokens == 0

    with client.messages.stream(model="tiny", max_tokens=12, messages=HELLO, extra_body=GREEDY) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == whole.content[0].text
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == \
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens


def test_raw_stream_events_come_in_the_order_the_sdk_expects(client, server):
    events = list(create(client, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    start = events[0].message
    assert start.content == [] and start.stop_reason is None and start.id.startswith("msg_")
    assert events[1].index == 0 and events[1].content_block.type == "text" and events[1].content_block.text == ""
    assert all(event.index == 0 and event.delta.type == "text_delta" for event in events[2:-3])
    assert events[-2].delta.stop_reason in ("end_turn", "max_tokens") and events[-2].usage.output_tokens > 0

    # On the wire every event is named after its type, and a ping follows message_start.
    body = {"model": "tiny", "max_tokens": 4, "messages": HELLO, "stream": True}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        frames = [frame for frame in response.read().decode().split("\n\n") if frame]
    names = []
    for frame in frames:
        event_line, data_line = frame.split("\n")
        name = event_line.removeprefix("event: ")
        assert json.loads(data_line.removeprefix("data: "))["type"] == name
        names.append(name)
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"


def test_a_repeated_prompt_is_read_from_the_cache(client):
    messages = [{"role": "user", "content": "Tell me about the cache, then tell me again, please."}]
    first = create(client, messages, max_tokens=3)
    again = create(client, messages, max_tokens=3)
    prompt = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == prompt
    assert again.usage.cache_read_input_tokens >= prompt - 1  # the last prompt token is always evaluated again
    assert again.usage.input_tokens >= 1
    counted = client.messages.count_tokens(model="tiny", messages=messages)
    assert counted.input_tokens == prompt


def test_the_conversation_reaches_the_model_as_ollama_would_send_it(client, server):
    """System blocks, earlier turns in block form, and the last user turn: the same greedy answer as /api/chat."""
    conversation = [
        {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Blue."}]},
        {"role": "user", "content": [{"type": "text", "text": "Another"}, {"type": "text", "text": "one?"}]},
    ]
    system = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Answer in one word."}]
    ours = create(client, conversation, max_tokens=10, system=system)
    theirs = ollama.Client(host=server.url).chat(model="tiny", options=GREEDY | {"num_predict": 10}, messages=[
        {"role": "system", "content": "You are terse.\n\nAnswer in one word."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another\n\none?"},
    ])
    assert text_of(ours) == theirs.message.content
    assert ours.usage.output_tokens == theirs.eval_count


def test_max_tokens_zero_only_reads_the_prompt(client):
    message = create(client, max_tokens=0)
    assert message.content == [] and message.stop_reason == "max_tokens" and message.usage.output_tokens == 0


def stop_case(client):
    full = text_of(create(client, max_tokens=20))
    stop = full[5:8]
    assert stop.strip() and stop not in full[:7], "pick a stop string that first appears at offset 5"
    return full, stop, create(client, max_tokens=20, stop_sequences=[stop])


def test_stop_sequences_end_the_message(client):
    full, _, stopped = stop_case(client)
    assert text_of(stopped) == full[:5]
    assert stopped.stop_reason in ("end_turn", "stop_sequence")


def test_stop_sequences_are_reported_as_such(client):
    _, stop, stopped = stop_case(client)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop


def test_count_tokens_counts_system_and_tools(client):
    tool = {"name": "get_time", "description": "The time now", "input_schema": {"type": "object", "properties": {}}}

    def count(**fields):
        return client.messages.count_tokens(model="tiny", messages=HELLO, **fields).input_tokens

    plain = count()
    assert plain > 0
    assert count(system="You are a helpful assistant.") > plain
    assert count(tools=[tool]) > plain
    assert count(tools=[tool], tool_choice={"type": "any"}) == count(tools=[tool])  # constrains decoding, not the prompt
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.count_tokens(model="absent", messages=HELLO)
    assert "not found" in missing.value.message


def png_base64(size=(4, 4)) -> str:
    out = io.BytesIO()
    Image.new("RGB", size, "red").save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def image_block(data: str, media_type="image/png", kind="base64"):
    source = {"type": kind, "media_type": media_type, "data": data} if kind == "base64" else {"type": kind, "url": data}
    return {"type": "image", "source": source}


WEATHER_TOOL = {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {
    "city": {"type": "string"}}, "required": ["city"]}}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}


def body(**fields):
    return {"model": "tiny", "max_tokens": 8, "messages": HELLO} | fields


BAD_REQUESTS = {
    "max_tokens missing": ({"model": "tiny", "messages": HELLO}, "max_tokens"),
    "max_tokens negative": (body(max_tokens=-1), "max_tokens"),
    "no messages": (body(messages=[]), "at least one message"),
    "unknown role": (body(messages=[{"role": "tool", "content": "hi"}]), "messages.0.role: 'tool' is not one of"),
    "tool result without its call": (
        body(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}]),
        "'toolu_x' matches no tool_use block"),
    "tool result answering a later call": (
        body(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "1"}]},
                       {"role": "assistant", "content": [CALL]}, {"role": "user", "content": "go on"}],
             tools=[WEATHER_TOOL]),
        "'toolu_1' matches no tool_use block"),
    "tool use in a user turn": (body(messages=[{"role": "user", "content": [CALL]}]), "belong in assistant turns"),
    "prefill": (body(messages=HELLO + [{"role": "assistant", "content": "Sure"}]), "prefill"),
    "schema not an object": (body(tools=[WEATHER_TOOL | {"input_schema": "city"}]), "tools.0.input_schema"),
    "schema of a string": (body(tools=[WEATHER_TOOL | {"input_schema": {"type": "string"}}]), "JSON Schema of type object"),
    "tool without a name": (body(tools=[{"input_schema": {"type": "object"}}]), "tools.0.name"),
    "tool name with a space": (body(tools=[WEATHER_TOOL | {"name": "get weather"}]), "tools.0.name"),
    "tools twice": (body(tools=[WEATHER_TOOL, WEATHER_TOOL]), "unique"),
    "server tool": (body(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "server tool 'web_search'"),
    "strict tool": (body(tools=[WEATHER_TOOL | {"strict": True}]), "cannot be enforced"),
    "a tool call forced": (body(tools=[WEATHER_TOOL], tool_choice={"type": "any"}), "tool_choice 'required'"),
    "a named tool call forced": (body(tools=[WEATHER_TOOL], tool_choice={"type": "tool", "name": "get_weather"}),
                                 "tool_choice 'named'"),
    "unknown tool choice": (body(tools=[WEATHER_TOOL], tool_choice={"type": "some"}), "tool_choice.type"),
    "named tool not declared": (body(tools=[WEATHER_TOOL], tool_choice={"type": "tool", "name": "other"}), "'other'"),
    "unknown thinking type": (body(thinking={"type": "sometimes"}), "thinking.type"),
    "thinking without a budget": (body(thinking={"type": "enabled"}), "thinking.budget_tokens"),
    "image that is not an image": (
        body(messages=[{"role": "user", "content": [image_block(base64.b64encode(b"just text").decode())]}]),
        "not an image"),
    "image of another type": (
        body(messages=[{"role": "user", "content": [image_block(png_base64(), "image/jpeg")]}]),
        "declared as image/jpeg but its bytes are image/png"),
    "image not in base64": (body(messages=[{"role": "user", "content": [image_block("%%%")]}]), "base64"),
    "image by URL": (body(messages=[{"role": "user", "content": [image_block("https://example.com/a.png", kind="url")]}]),
                     "image URLs are not supported"),
    "image for a model without vision": (
        body(messages=[{"role": "user", "content": [image_block(png_base64()), {"type": "text", "text": "What?"}]}]),
        "does not support images"),
    "document": (body(messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}]), "'document'"),
    "MCP servers": (body(mcp_servers=[{"type": "url", "url": "https://example.com", "name": "x"}]), "mcp_servers"),
    "context management by the server": (body(context_management={"edits": [{"type": "clear_tool_uses_20250919"}]}),
                                         "'clear_tool_uses_20250919' is not supported"),
    "malformed output format": (body(output_config={"format": {"type": "xml"}}), "output_config.format"),
    "temperature of the wrong type": (body(temperature="hot"), "temperature"),
}


@pytest.mark.parametrize("request_body, expected", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_bad_requests_are_anthropic_400s(client, request_body, expected):
    with pytest.raises(anthropic.BadRequestError) as error:
        client.post("/v1/messages", cast_to=object, body=request_body)
    assert error.value.body["type"] == "error"
    assert error.value.body["error"]["type"] == "invalid_request_error"
    assert expected in error.value.message


def test_structured_output_is_the_pipeline_format(client, server):
    """output_config.format is served as Ollama's `format` is: enforced, or refused with the same reason."""
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    try:
        expected = ollama.Client(host=server.url).chat(model="tiny", messages=HELLO, format=schema,
                                                        options=GREEDY | {"num_predict": 40}).message.content
    except ollama.ResponseError as refused:
        with pytest.raises(anthropic.APIStatusError) as error:
            create(client, output_config={"format": {"type": "json_schema", "schema": schema}}, max_tokens=40)
        assert (error.value.status_code, error.value.body["error"]["message"]) == (refused.status_code, refused.error)
    else:
        message = create(client, output_config={"format": {"type": "json_schema", "schema": schema}}, max_tokens=40)
        assert text_of(message) == expected


def test_unknown_model_and_unparseable_bodies(client):
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="absent", max_tokens=4, messages=HELLO)
    assert "'absent:latest' not found" in missing.value.message
    assert missing.value.body["error"]["type"] == "not_found_error"

    invalid_utf8 = b'{"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "\xff"}]}'
    with pytest.raises(anthropic.BadRequestError) as undecodable:
        client.post("/v1/messages", cast_to=object, content=invalid_utf8, options={"headers": {
            "content-type": "application/json"}})
    assert "invalid JSON body" in undecodable.value.message

    with pytest.raises(anthropic.BadRequestError) as not_json:
        client.post("/v1/messages", cast_to=object, content=b"[1, 2]", options={"headers": {
            "content-type": "application/json"}})
    assert "JSON object" in not_json.value.message


def test_an_oversize_request_is_refused(client):
    huge = body(messages=[{"role": "user", "content": "x" * (65 << 20)}])
    with pytest.raises(anthropic.APIStatusError) as too_large:
        client.post("/v1/messages", cast_to=object, body=huge)
    assert too_large.value.status_code == 413
    assert too_large.value.body["error"]["type"] == "request_too_large"


def test_a_runner_that_dies_mid_stream_ends_the_stream_with_an_error_event(client, server):
    stream = client.messages.create(model="tiny", max_tokens=4000, messages=[{"role": "user", "content": "Go on"}],
                                    extra_body=GREEDY, stream=True)
    events = iter(stream)
    assert next(events).type == "message_start"
    (pid,) = server.runner_pids()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(anthropic.APIStatusError) as failed:
        for _ in events:
            pass
    assert "killed by signal 9" in failed.value.message
    assert failed.value.body["type"] == "error" and failed.value.body["error"]["type"] == "api_error"
    assert create(client, max_tokens=2).usage.output_tokens > 0  # the next request loads the model again
