"""End to end with a model that really calls tools and thinks, through /api/chat and the official `ollama` client."""

import ollama
import pytest

from plugd.testing import transcripts as scenario

WEATHER_TOOL = {"type": "function", "function": {"name": scenario.WEATHER_TOOL.name,
                                                 "description": scenario.WEATHER_TOOL.description,
                                                 "parameters": scenario.WEATHER_TOOL.parameters}}
QUESTION = {"role": "user", "content": scenario.WEATHER_QUESTION}


@pytest.fixture(scope="module")
def client(agent_server):
    return ollama.Client(host=agent_server.url)


@pytest.mark.parametrize("keep_thinking", [True, False])
def test_tool_call_round_trip(client, keep_thinking):
    called = client.chat(model="agent", messages=[QUESTION], tools=[WEATHER_TOOL])
    assert called.message.thinking == scenario.WEATHER_CALL_THINKING
    assert called.message.content == ""
    (call,) = called.message.tool_calls
    assert (call.function.name, dict(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert called.done_reason == "stop" and called.eval_count > 0 and called.prompt_eval_count > 0

    assistant = called.message.model_dump(exclude_none=True)
    if not keep_thinking:
        del assistant["thinking"]
    result = {"role": "tool", "tool_name": "get_weather", "content": scenario.WEATHER_RESULT}
    answered = client.chat(model="agent", messages=[QUESTION, assistant, result], tools=[WEATHER_TOOL])
    assert answered.message.content == scenario.WEATHER_ANSWER
    assert answered.message.thinking == scenario.WEATHER_ANSWER_THINKING
    assert not answered.message.tool_calls


def test_streamed_tool_call_arrives_whole_in_one_chunk(client):
    chunks = list(client.chat(model="agent", messages=[QUESTION], tools=[WEATHER_TOOL], stream=True))
    calls = [c.message.tool_calls for c in chunks if c.message.tool_calls]
    assert len(calls) == 1 and calls[0][0].function.name == "get_weather"
    assert "".join(c.message.thinking or "" for c in chunks) == scenario.WEATHER_CALL_THINKING
    assert chunks[-1].done and chunks[-1].done_reason == "stop"


@pytest.mark.parametrize(("think", "thinking", "content"), [
    (None, scenario.HELLO_THINKING, scenario.HELLO_ANSWER),
    (True, scenario.HELLO_THINKING, scenario.HELLO_ANSWER),
    ("high", scenario.HELLO_THINKING, scenario.HELLO_ANSWER),
    (False, None, scenario.HELLO_ANSWER_WITHOUT_THINKING),
])
def test_think_levels(client, think, thinking, content):
    reply = client.chat(model="agent", messages=[{"role": "user", "content": scenario.HELLO_QUESTION}], think=think)
    assert (reply.message.thinking, reply.message.content) == (thinking, content)


def test_generate_surfaces_thinking_too(client):
    reply = client.generate(model="agent", prompt=scenario.HELLO_QUESTION)
    assert (reply.thinking, reply.response) == (scenario.HELLO_THINKING, scenario.HELLO_ANSWER)


def test_errors_are_the_sdks_own(client):
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="agent", messages=[QUESTION, {"role": "tool", "content": "18"}], tools=[WEATHER_TOOL])
    assert err.value.status_code == 400 and "answers no earlier tool call" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="no-such-model", messages=[QUESTION])
    assert err.value.status_code == 404
