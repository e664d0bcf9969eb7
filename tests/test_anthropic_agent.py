"""End to end with a model that really calls tools and thinks: the `agent_server` fixture's trained tiny checkpoint,
driven through /v1/messages by the official `anthropic` client.

The model reproduces its transcripts only when the Anthropic translation yields exactly the plugd messages it was
trained on (thinking kept in the history, as Anthropic clients send it back), so every answer checked here is also
a check of that translation.
"""

import anthropic
import pytest

from plugd.testing import transcripts as scenario

WEATHER_TOOL = {"name": scenario.WEATHER_TOOL.name, "description": scenario.WEATHER_TOOL.description,
                "input_schema": scenario.WEATHER_TOOL.parameters}
QUESTION = [{"role": "user", "content": scenario.WEATHER_QUESTION}]
HELLO = [{"role": "user", "content": scenario.HELLO_QUESTION}]


@pytest.fixture(scope="module")
def client(agent_server):
    return anthropic.Anthropic(base_url=agent_server.url, api_key="unused", max_retries=0)


def create(client, messages, **fields):
    return client.messages.create(model="agent", max_tokens=200, messages=messages, **fields)


def blocks_of(message, kind):
    return [block for block in message.content if block.type == kind]


def check_weather_call(message):
    assert message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == ["thinking", "tool_use"]
    thinking, call = message.content
    assert thinking.thinking == scenario.WEATHER_CALL_THINKING and thinking.signature == ""
    assert (call.name, call.input) == ("get_weather", {"city": "Paris"}) and call.id.startswith("call_")


def check_weather_answer(message):
    assert message.stop_reason == "end_turn"
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == scenario.WEATHER_ANSWER_THINKING
    assert message.content[1].text == scenario.WEATHER_ANSWER


def tool_result(call_id, **fields):
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id,
                                         "content": scenario.WEATHER_RESULT} | fields]}


def test_tool_call_round_trip(client):
    called = create(client, QUESTION, tools=[WEATHER_TOOL])
    check_weather_call(called)
    call = blocks_of(called, "tool_use")[0]

    # The SDK's content blocks go back as they came: thinking, signature and all.
    answered = create(client, QUESTION + [{"role": "assistant", "content": called.content}, tool_result(call.id)],
                      tools=[WEATHER_TOOL])
    check_weather_answer(answered)
    # The answer's prompt begins with the question's: the runner reuses what it computed for it.
    assert 0 < answered.usage.cache_read_input_tokens
    assert answered.usage.input_tokens > 0 and answered.usage.output_tokens > 0


def test_streamed_tool_call_round_trip(client):
    with client.messages.stream(model="agent", max_tokens=200, messages=QUESTION, tools=[WEATHER_TOOL]) as stream:
        events = list(stream)
        called = stream.get_final_message()
    check_weather_call(called)
    starts = [(e.index, e.content_block.type) for e in events if e.type == "content_block_start"]
    stops = [e.index for e in events if e.type == "content_block_stop"]
    assert starts == [(0, "thinking"), (1, "tool_use")] and stops == [0, 1]
    deltas = {e.delta.type for e in events if e.type == "content_block_delta"}
    assert deltas == {"thinking_delta", "signature_delta", "input_json_delta"}

    call = blocks_of(called, "tool_use")[0]
    history = QUESTION + [{"role": "assistant", "content": called.content}, tool_result(call.id)]
    with client.messages.stream(model="agent", max_tokens=200, messages=history, tools=[WEATHER_TOOL]) as stream:
        text = "".join(stream.text_stream)
        answered = stream.get_final_message()
    check_weather_answer(answered)
    assert text == scenario.WEATHER_ANSWER


def test_thinking_surfaces_as_thinking_blocks_and_can_be_turned_off(client):
    hello = create(client, HELLO)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in hello.content] == [
        ("thinking", scenario.HELLO_THINKING), ("text", scenario.HELLO_ANSWER)]
    assert create(client, HELLO, thinking={"type": "enabled", "budget_tokens": 1024}).content == hello.content

    plain = create(client, HELLO, thinking={"type": "disabled"})
    assert [(b.type, b.text) for b in plain.content] == [("text", scenario.HELLO_ANSWER_WITHOUT_THINKING)]

    hidden = create(client, HELLO, thinking={"type": "enabled", "budget_tokens": 1024, "display": "omitted"})
    assert [(b.type, getattr(b, "thinking", None)) for b in hidden.content] == [("thinking", ""), ("text", None)]
    assert hidden.content[1].text == scenario.HELLO_ANSWER


def test_count_tokens_matches_the_prompt_the_model_was_given(client):
    history = QUESTION + [{"role": "assistant", "content": [
        {"type": "thinking", "thinking": scenario.WEATHER_CALL_THINKING, "signature": ""},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]}, tool_result("toolu_1")]
    answered = create(client, history, tools=[WEATHER_TOOL])
    check_weather_answer(answered)
    counted = client.messages.count_tokens(model="agent", messages=history, tools=[WEATHER_TOOL])
    assert counted.input_tokens == answered.usage.input_tokens + answered.usage.cache_read_input_tokens
