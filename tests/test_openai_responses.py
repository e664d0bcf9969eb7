"""End to end: OpenAI's Responses API (/v1/responses) on a live `plugd serve`, driven by the official `openai` client."""

import base64
import io
import json

import ollama
import openai
import pytest
from PIL import Image
from transformers import AutoTokenizer

from plugd.testing import transcripts as scenario
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.plugins import write_distribution

# Parsers that make a random-weight model's output look like an agent's: thinking, text and a tool call
# ("scripted"), or output that cannot be parsed once it ends ("fails-at-end").
PARSERS = """
    from plugd.hookspecs import ParsedPiece, Parser, hookimpl
    from plugd.parsing import ParseError
    from plugd.types import ToolCall

    THINKING_CHARACTERS = 8

    class Scripted:
        def __init__(self, tools):
            self.tools = tools
            self.seen = 0

        def feed(self, text):
            split = max(0, THINKING_CHARACTERS - self.seen)
            self.seen += len(text)
            pieces = [ParsedPiece("thinking", text[:split]), ParsedPiece("content", text[split:])]
            return [p for p in pieces if p.text]

        def finish(self):  # one call per tool offered
            return [ParsedPiece("tool_call", tool_call=ToolCall(t.name, {"city": "Paris"})) for t in self.tools]

    class FailsAtEnd:
        def feed(self, text):
            return [ParsedPiece("content", text)]

        def finish(self):
            raise ParseError("an unclosed tool call")

    @hookimpl
    def plugd_parsers():
        return [Parser(name="scripted", create=lambda tools, prompt: Scripted(tools)),
                Parser(name="fails-at-end", create=lambda tools, prompt: FailsAtEnd())]
"""
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
GREEDY = {"temperature": 0, "max_output_tokens": 12}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("tiny"), "qwen3", seed=0)


@pytest.fixture(scope="module")
def server(tmp_path_factory, checkpoint, modelfile_server):
    site = write_distribution(tmp_path_factory.mktemp("site"), "responses-parsers", {"responses_parsers": PARSERS},
                             {"responses-parsers": "responses_parsers"})
    return modelfile_server({"tiny": f"FROM {checkpoint}\nRENDERER jinja\n", "scripted": "FROM tiny\nPARSER scripted\n",
                             "failing": "FROM tiny\nPARSER fails-at-end\n"}, env={"PYTHONPATH": str(site)})


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="plugd", max_retries=0)


def _collapsed(types):
    """Event types with runs of the same delta event folded into one."""
    return [t for i, t in enumerate(types) if not (t.endswith(".delta") and i and types[i - 1] == t)]


def test_create_answers_with_a_response_object(client):
    response = client.responses.create(model="tiny", input="Hello", **GREEDY)
    assert response.id.startswith("resp_") and response.object == "response" and response.model == "tiny"
    assert response.store is False and response.error is None and response.tools == []
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    (part,) = message.content
    assert part.type == "output_text" and part.annotations == [] and part.text
    assert response.output_text == part.text

    usage = response.usage
    assert usage.output_tokens == 12 and usage.input_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert 0 <= usage.input_tokens_details.cached_tokens <= usage.input_tokens
    # Greedy decoding of this seed does not stop within 12 tokens: the response ran out of room.
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert message.status == "incomplete"


def test_stream_events_in_order_and_agreeing_with_the_whole_response(client):
    whole = client.responses.create(model="tiny", input="Hello", **GREEDY)
    events = list(client.responses.create(model="tiny", input="Hello", stream=True, **GREEDY))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert _collapsed([e.type for e in events]) == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.incomplete",
    ]
    created, final = events[0].response, events[-1].response
    assert created.status == "in_progress" and created.output == [] and created.id == final.id
    added = events[2].item
    assert added.type == "message" and added.status == "in_progress" and added.content == []
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert all(e.item_id == added.id and e.output_index == 0 and e.content_index == 0 for e in deltas)
    text = "".join(e.delta for e in deltas)
    assert text == events[-4].text == events[-3].part.text == final.output_text == whole.output_text
    assert events[-2].item.status == "incomplete"
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens


def _function_call(call_id, city):
    return {"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": json.dumps({"city": city})}


def test_input_items_render_as_the_chat_template_renders_the_same_conversation(server, client, checkpoint):
    """The Responses input becomes exactly the conversation a Hugging Face client would send; proved by the prompt's
    length and by greedy output identical to a raw generation from the template's own rendering."""
    conversation = [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Ask the tool."}]},
        _function_call("call_1", "Paris"),
        _function_call("call_2", "Lyon"),
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "20C"}]},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "Both known."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Paris 18C, Lyon 20C."}]},
        {"role": "user", "content": "Thanks"},
    ]
    hf_calls = [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
                for city in ("Paris", "Lyon")]
    hf_messages = [
        {"role": "system", "content": "Be terse.\n\nUse tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Ask the tool.", "tool_calls": hf_calls},
        {"role": "tool", "content": "18C"},
        {"role": "tool", "content": "20C"},
        {"role": "assistant", "content": "Paris 18C, Lyon 20C.", "reasoning_content": "Both known."},
        {"role": "user", "content": "Thanks"},
    ]
    hf_tool = {"type": "function", "function": {k: WEATHER_TOOL[k] for k in ("name", "description", "parameters")}}
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    prompt = tokenizer.apply_chat_template(hf_messages, tools=[hf_tool], add_generation_prompt=True, tokenize=False)

    response = client.responses.create(model="tiny", instructions="Be terse.", input=conversation, tools=[WEATHER_TOOL],
                                       **GREEDY)
    raw = ollama.Client(host=server.url).generate(model="tiny", prompt=prompt, raw=True,
                                                  options={"temperature": 0, "num_predict": 12})
    assert response.usage.input_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
    assert response.output_text == raw.response


def test_thinking_text_and_tool_calls_become_output_items_in_order(client):
    response = client.responses.create(model="scripted", input="Hello", tools=[WEATHER_TOOL], **GREEDY)
    reasoning, message, call = response.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_") and reasoning.summary == []
    assert len(reasoning.content[0].text) == 8 and reasoning.content[0].type == "reasoning_text"
    assert message.type == "message" and message.status == "completed" and message.content[0].text
    assert call.type == "function_call" and call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"} and call.status == "completed"
    assert response.output_text == message.content[0].text

    events = list(client.responses.create(model="scripted", input="Hello", tools=[WEATHER_TOOL], stream=True, **GREEDY))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert _collapsed([e.type for e in events]) == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.incomplete",
    ]
    thinking = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thinking == reasoning.content[0].text
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1, 2]
    done = events[-2].item
    assert done.type == "function_call" and done.arguments == call.arguments and done.call_id.startswith("call_")
    streamed = events[-1].response.output
    assert [item.type for item in streamed] == ["reasoning", "message", "function_call"]
    assert streamed[1].content[0].text == message.content[0].text


def test_tool_choice_none_offers_no_tools(client):
    response = client.responses.create(model="scripted", input="Hello", tools=[WEATHER_TOOL], tool_choice="none",
                                       **GREEDY)
    assert [item.type for item in response.output] == ["reasoning", "message"]


def test_output_that_cannot_be_parsed_fails_the_response(client):
    events = list(client.responses.create(model="failing", input="Hello", stream=True, **GREEDY))
    failed = events[-1]
    assert failed.type == "response.failed" and failed.sequence_number == len(events) - 1
    assert failed.response.status == "failed" and "an unclosed tool call" in failed.response.error.message
    assert failed.response.output[0].status == "incomplete" and failed.response.output[0].content[0].text
    with pytest.raises(openai.InternalServerError, match="an unclosed tool call"):
        client.responses.create(model="failing", input="Hello", **GREEDY)


def _png_data_url() -> str:
    out = io.BytesIO()
    Image.new("RGB", (2, 2)).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def _user_image(url=None, **part):
    return [{"role": "user", "content": [{"type": "input_text", "text": "What is it?"},
                                         {"type": "input_image", "detail": "auto", "image_url": url, **part}]}]


def _text_data_url(text: str) -> str:
    return "data:image/png;base64," + base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(("request_fields", "message"), [
    ({"previous_response_id": "resp_1"}, "plugd does not store responses"),
    ({"conversation": "conv_1"}, "conversation is not supported"),
    ({"background": True}, "background responses are not supported"),
    ({"tools": [{"type": "local_shell"}]}, "tool type 'local_shell' is not supported"),
    ({"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}},
     "tool_choice forces the hosted tool 'web_search', which plugd cannot run"),
    ({"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}, "tool_choice 'allowed_tools' is not"),
    ({"tools": [WEATHER_TOOL, {"type": "namespace", "name": "n", "description": "", "tools": [WEATHER_TOOL]}]},
     "a tool named 'get_weather' is offered twice"),
    ({"tools": [{"type": "namespace", "name": "n", "description": "", "tools": [{"type": "web_search"}]}]},
     "namespace 'n': tool type 'web_search' is not supported in a namespace"),
    ({"tools": [{"type": "custom", "name": "patch", "format": {"type": "regex"}}]}, "format must be text or grammar"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "get_time"}}, "not among the tools"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning effort 'extreme'"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format 'grammar' is not supported"),
    ({"max_output_tokens": 0}, "max_output_tokens must be at least 1"),
    ({"truncation": "sideways"}, "truncation 'sideways'"),
    ({"input": []}, "non-empty list"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]: item_reference is not supported"),
    ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input item type 'computer_call_output'"),
    ({"input": [{"role": "wizard", "content": "hi"}]}, "invalid message role 'wizard'"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "'input_file' is not supported"),
    ({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "18C"}]},
     "input[0]: function_call_output call_id 'call_9' answers no earlier function_call"),
    ({"input": [{"type": "custom_tool_call_output", "call_id": "call_9", "output": "done"}]},
     "input[0]: custom_tool_call_output call_id 'call_9' answers no earlier custom_tool_call"),
    ({"input": [_function_call("call_1", "Paris") | {"arguments": "{"}]}, "are not valid JSON"),
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": "thought"}]}, "reasoning summary must be a list of parts"),
    ({"input": _user_image("https://example.com/cat.png")}, "does not fetch remote URLs"),
    ({"input": _user_image(file_id="file_1")}, "file_id is not supported"),
    ({"input": _user_image(_text_data_url("plain words"))}, "not an image"),
    ({"input": _user_image("data:image/png;base64,%%%")}, "not valid base64"),
    ({"input": _user_image(_png_data_url())}, "does not support images"),
])
def test_bad_requests_are_400s_the_client_raises(client, request_fields, message):
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(**({"model": "tiny", "input": "Hello"} | request_fields))
    assert message in raised.value.message
    assert raised.value.body["type"] == "invalid_request_error"


def test_unknown_model_and_stored_responses_are_404s(client):
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.responses.create(model="no-such-model", input="Hello")
    with pytest.raises(openai.NotFoundError, match="does not store responses"):
        client.responses.retrieve("resp_123")
    with pytest.raises(openai.NotFoundError, match="does not store responses"):
        client.responses.delete("resp_123")


# With the `agent_server` fixture's trained model, which answers its transcripts word for word only when this
# dialect's translation yields exactly the conversation it was trained on.
AGENT_WEATHER_TOOL = {"type": "function", "name": scenario.WEATHER_TOOL.name,
                      "description": scenario.WEATHER_TOOL.description, "parameters": scenario.WEATHER_TOOL.parameters}
WEATHER_QUESTION = [{"role": "user", "content": scenario.WEATHER_QUESTION}]


@pytest.fixture(scope="module")
def agent(agent_server):
    return openai.OpenAI(base_url=f"{agent_server.url}/v1", api_key="plugd", max_retries=0)


@pytest.mark.parametrize("history", ["the output items sent back", "the reasoning item left out"])
def test_function_call_round_trip(agent, history):
    called = agent.responses.create(model="agent", input=scenario.WEATHER_QUESTION, tools=[AGENT_WEATHER_TOOL])
    assert called.status == "completed" and called.output_text == ""
    reasoning, call = called.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == scenario.WEATHER_CALL_THINKING
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"}

    sent_back = [item.model_dump(exclude_none=True) for item in called.output
                 if history == "the output items sent back" or item.type != "reasoning"]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": scenario.WEATHER_RESULT}
    answered = agent.responses.create(model="agent", input=WEATHER_QUESTION + sent_back + [result],
                                      tools=[AGENT_WEATHER_TOOL])
    assert answered.status == "completed"
    reasoning, message = answered.output
    assert reasoning.content[0].text == scenario.WEATHER_ANSWER_THINKING
    assert message.type == "message" and answered.output_text == scenario.WEATHER_ANSWER
    # The answer's prompt begins with the question's: the runner reuses what it computed for it.
    assert 0 < answered.usage.input_tokens_details.cached_tokens < answered.usage.input_tokens


def test_streamed_function_call(agent):
    events = list(agent.responses.create(model="agent", input=scenario.WEATHER_QUESTION, tools=[AGENT_WEATHER_TOOL],
                                         stream=True))
    assert _collapsed([e.type for e in events]) == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed",
    ]
    thinking = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thinking == scenario.WEATHER_CALL_THINKING
    call = events[-2].item
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert events[-1].response.usage.output_tokens > 0


def test_stream_helper_assembles_the_final_response(agent):
    with agent.responses.stream(model="agent", input=scenario.HELLO_QUESTION) as stream:
        snapshots = [e.snapshot for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert snapshots[-1] == final.output_text == scenario.HELLO_ANSWER
    reasoning, _ = final.output
    assert reasoning.content[0].text == scenario.HELLO_THINKING


@pytest.mark.parametrize("effort", ["none", "minimal"])
def test_reasoning_effort_none_turns_thinking_off(agent, effort):
    response = agent.responses.create(model="agent", input=scenario.HELLO_QUESTION, reasoning={"effort": effort})
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == scenario.HELLO_ANSWER_WITHOUT_THINKING
    assert response.reasoning.effort == effort



def test_parallel_tool_calls_false_keeps_the_first_call_only(client):
    tools = [WEATHER_TOOL, WEATHER_TOOL | {"name": "get_time"}]
    both = client.responses.create(model="scripted", input="Weather and time?", tools=tools, **GREEDY)
    assert [i.name for i in both.output if i.type == "function_call"] == ["get_weather", "get_time"]
    one = client.responses.create(model="scripted", input="Weather and time?", tools=tools, parallel_tool_calls=False,
                                  **GREEDY)
    assert [i.name for i in one.output if i.type == "function_call"] == ["get_weather"]
    assert one.parallel_tool_calls is False
