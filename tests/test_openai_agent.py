"""End to end with a model that really calls tools and thinks: the `agent_server` fixture's trained tiny checkpoint,
driven through /v1/chat/completions and /v1/completions by the official `openai` client.

The model reproduces its transcripts only when the OpenAI translation yields exactly the plugd messages it was
trained on, so every answer checked here is also a check of that translation.
"""

import json

import openai
import pytest

from plugd.testing import transcripts as scenario

WEATHER_TOOL = {"type": "function", "function": {"name": scenario.WEATHER_TOOL.name,
                                                 "description": scenario.WEATHER_TOOL.description,
                                                 "parameters": scenario.WEATHER_TOOL.parameters}}
QUESTION = [{"role": "user", "content": scenario.WEATHER_QUESTION}]
HELLO = [{"role": "user", "content": scenario.HELLO_QUESTION}]


@pytest.fixture(scope="module")
def client(agent_server):
    return openai.OpenAI(base_url=agent_server.url + "/v1", api_key="unused", max_retries=0)


def chat(client, messages, **fields):
    return client.chat.completions.create(model="agent", messages=messages, **fields)


def answer_with_result(client, assistant_message, call_id):
    result = {"role": "tool", "tool_call_id": call_id, "content": scenario.WEATHER_RESULT}
    return chat(client, QUESTION + [assistant_message, result], tools=[WEATHER_TOOL])


@pytest.mark.parametrize("history", ["as OpenAI clients write it", "the SDK's message sent back"])
def test_tool_call_round_trip(client, history):
    called = chat(client, QUESTION, tools=[WEATHER_TOOL])
    (choice,) = called.choices
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert choice.message.reasoning_content.strip() == scenario.WEATHER_CALL_THINKING
    assert not (choice.message.content or "").strip()

    if history == "as OpenAI clients write it":  # no reasoning_content in the history
        assistant = {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": call.function.arguments}}]}
    else:  # the parsed message object itself, reasoning_content and all: the thinking stays in the history
        assistant = choice.message
    answered = answer_with_result(client, assistant, call.id)
    (choice,) = answered.choices
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content.strip() == scenario.WEATHER_ANSWER
    assert choice.message.reasoning_content.strip() == scenario.WEATHER_ANSWER_THINKING
    # The answer's prompt begins with the question's: the runner reuses what it computed for it.
    assert 0 < answered.usage.prompt_tokens_details.cached_tokens < answered.usage.prompt_tokens


def test_text_parts_are_joined_back_to_back(client):
    question = scenario.WEATHER_QUESTION
    parts = [{"type": "text", "text": question[:20]}, {"type": "text", "text": question[20:]}]
    (call,) = chat(client, [{"role": "user", "content": parts}], tools=[WEATHER_TOOL]).choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})


def test_streamed_tool_call(client):
    chunks = list(chat(client, QUESTION, tools=[WEATHER_TOOL], stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thinking = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    assert thinking.strip() == scenario.WEATHER_CALL_THINKING
    (call,) = [call for d in deltas for call in d.tool_calls or []]
    assert call.index == 0 and call.id.startswith("call_") and call.type == "function"
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_thinking_surfaces_as_reasoning_content_and_can_be_turned_off(client):
    message = chat(client, HELLO).choices[0].message
    assert (message.reasoning_content.strip(), message.content.strip()) == (scenario.HELLO_THINKING,
                                                                             scenario.HELLO_ANSWER)
    streamed = [c.choices[0].delta for c in chat(client, HELLO, stream=True)]
    assert "".join(d.content or "" for d in streamed) == message.content
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in streamed) == message.reasoning_content

    quick = chat(client, HELLO, reasoning_effort="none").choices[0].message
    assert quick.content.strip() == scenario.HELLO_ANSWER_WITHOUT_THINKING
    assert getattr(quick, "reasoning_content", None) is None


def test_repeated_prompt_is_served_from_the_cache(client):
    first = chat(client, HELLO).usage
    second = chat(client, HELLO).usage
    assert (second.prompt_tokens, second.completion_tokens) == (first.prompt_tokens, first.completion_tokens)
    # All of it but (with the runner's default cache) the last token, which decoding starts from.
    assert second.prompt_tokens - 1 <= second.prompt_tokens_details.cached_tokens < second.prompt_tokens


def test_raw_completion_of_a_transcript_prompt(client):
    response = client.completions.create(model="agent", prompt=scenario.HELLO.prompt())
    assert response.choices[0].text == scenario.HELLO.completion()
    assert response.choices[0].finish_reason == "stop"
