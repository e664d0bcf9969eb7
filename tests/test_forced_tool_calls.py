"""tool_choice "required" or a named tool: the call is forced in the family's own format through the grammar engine,
and the family's parser reads it back, even from a random-weight model."""

import json
from pathlib import Path

import anthropic
import jsonschema
import openai
import pytest

from plugd.testing.server import LiveServer
from plugd.testing.structured import json_leaning_checkpoint

SCHEMAS = Path(__file__).resolve().parent / "reference" / "json_schemas"
TODO = json.loads((SCHEMAS / "jsb-Glaiveai2K__create_todo_e7e42931.json").read_text())
TODO_TOOL = {"type": "function", "function": {"name": "create_todo", "description": "Add a todo item",
                                              "parameters": TODO}}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                 "parameters": {"type": "object", "properties": {
                                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
                                                     "required": ["unit"]}}}
SAMPLING = {"temperature": 1.0, "seed": 7, "max_tokens": 256}


@pytest.fixture(scope="module")
def server(tmp_path_factory, modelfile_server):
    checkpoint = json_leaning_checkpoint(tmp_path_factory.mktemp("forced") / "model")
    return modelfile_server({name: f"FROM {checkpoint}\nRENDERER jinja\nPARSER {parser}\n"
                             for name, parser in {"hermes": "qwen3", "xml": "qwen3-coder"}.items()})


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _todo(client, **fields):
    return client.chat.completions.create(model="hermes", messages=[{"role": "user", "content": "Plan my week."}],
                                          tools=[WEATHER_TOOL, TODO_TOOL], **SAMPLING | fields)


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_required_gives_a_call_whose_arguments_follow_its_schema(client, seed):
    (choice,) = _todo(client, tool_choice="required", seed=seed).choices
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER_TOOL, TODO_TOOL)}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)


def test_a_named_tool_is_the_one_called(client, server):
    (choice,) = _todo(client, tool_choice={"type": "function", "function": {"name": "create_todo"}}).choices
    (call,) = choice.message.tool_calls
    assert call.function.name == "create_todo"
    streamed = list(_todo(client, tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True))
    calls = [c for chunk in streamed for c in (chunk.choices[0].delta.tool_calls or []) if chunk.choices]
    assert [c.function.name for c in calls] == ["get_weather"]

    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    reply = claude.messages.create(model="hermes", max_tokens=256, messages=[{"role": "user", "content": "Weather?"}],
                                   tools=[{"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}],
                                   tool_choice={"type": "any"})
    (block,) = [b for b in reply.content if b.type == "tool_use"]
    assert reply.stop_reason == "tool_use" and block.input["unit"] in ("celsius", "fahrenheit")


def test_running_out_of_tokens_gives_no_call_and_says_length(client):
    (choice,) = _todo(client, tool_choice="required", max_tokens=3).choices
    assert choice.finish_reason == "length" and not choice.message.tool_calls


def test_a_family_whose_calls_are_not_json_refuses_clearly(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="xml", messages=[{"role": "user", "content": "Plan."}],
                                       tools=[TODO_TOOL], tool_choice="required")
    assert "'qwen3-coder' cannot force a tool call" in err.value.message


def test_a_thinking_model_thinks_freely_then_answers_in_the_format(tmp_path):
    # Qwen3.5's template opens <think> in the prompt; this model leans hard towards closing it at once, a token
    # no JSON grammar allows: the format must wait for it, then hold the answer to the schema.
    checkpoint = json_leaning_checkpoint(tmp_path / "thinker", tokenizer="qwen3", leaning={"</think>": 12.0})
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    config["chat_template"] = (SCHEMAS.parent / "chat_templates" / "qwen3.5.jinja").read_text()
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(config))
    live = LiveServer(tmp_path / "models")
    try:
        live.cli("create", "thinker", "--from", str(checkpoint), check=True)
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
        schema = {"type": "object", "properties": {"done": {"type": "boolean"}}, "required": ["done"]}
        reply = client.chat.completions.create(
            model="thinker", messages=[{"role": "user", "content": "Done?"}], seed=7, max_tokens=64,
            response_format={"type": "json_schema", "json_schema": {"name": "status", "schema": schema}})
        (choice,) = reply.choices
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), schema)
    finally:
        live.stop()
