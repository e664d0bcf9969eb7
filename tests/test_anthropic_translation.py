"""The Anthropic dialect's translation, without a server: request bodies to plugd messages, deltas to content blocks."""

import json

import pytest

from plugd.builtins.jinja_renderer import render
from plugd.chat.pipeline import Delta, Final, ToolChoice
from plugd.hookspecs import RenderRequest
from plugd.server.anthropic_request import MessagesBody, messages_request, thinking_hidden
from plugd.server.anthropic_response import ContentBlocks, stop_reason, usage
from plugd.server.bodies import BadRequest
from plugd.testing import transcripts
from plugd.types import Message, ToolCall, structure


def translate(**fields):
    data = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "Hi"}]} | fields
    return messages_request(structure(data, MessagesBody), {"user-agent": "test"})


def anthropic_tool(tool):
    return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}


def anthropic_turns(messages):
    """Messages as an Anthropic client sends them back: thinking kept as signed blocks, tool results as user turns."""
    turns = []
    for message in messages:
        if message.role == "tool":
            turns.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.content}]})
        elif message.role == "assistant":
            blocks = [{"type": "thinking", "thinking": message.thinking, "signature": "sig"}] if message.thinking else []
            blocks += [{"type": "text", "text": message.content}] if message.content else []
            blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in message.tool_calls]
            turns.append({"role": "assistant", "content": blocks})
        else:
            turns.append({"role": message.role, "content": message.content})
    return turns


ANTHROPIC_EXCHANGES = [transcripts.WEATHER_CALL_TURN, transcripts.weather_answer_turn(keep_thinking=True, ids=True),
                       transcripts.HELLO, transcripts.HELLO_WITHOUT_THINKING]


@pytest.mark.parametrize("exchange", ANTHROPIC_EXCHANGES, ids=lambda e: e.name)
def test_an_anthropic_conversation_renders_exactly_as_the_trained_transcript(exchange):
    thinking = {None: {}, False: {"thinking": {"type": "disabled"}}}[exchange.think]
    chat = translate(messages=anthropic_turns(exchange.messages), tools=[anthropic_tool(t) for t in exchange.tools],
                     **thinking)
    assert chat.think == exchange.think
    prompt = render(RenderRequest(transcripts.MODEL_FILES, chat.messages, chat.tools, chat.think)).text
    assert prompt == exchange.prompt()


def test_system_prompt_blocks_and_request_fields():
    chat = translate(system=[{"type": "text", "text": "One.", "cache_control": {"type": "ephemeral"}},
                             {"type": "text", "text": "Two."}],
                     stop_sequences=["END"], temperature=0.5, top_p=0.9, top_k=20, metadata={"user_id": "u"},
                     thinking={"type": "enabled", "budget_tokens": 2048})
    assert chat.messages == [Message("system", "One."), Message("system", "Two."), Message("user", "Hi")]
    assert chat.options == {"num_predict": 100, "temperature": 0.5, "top_p": 0.9, "top_k": 20, "stop": ["END"]}
    assert chat.think is True and chat.dialect == "anthropic" and chat.headers == {"user-agent": "test"}
    assert translate(system="").messages == [Message("user", "Hi")]
    assert translate(thinking={"type": "adaptive"}).think is None


def test_a_user_turn_with_tool_results_and_text_becomes_tool_messages_then_the_text():
    turns = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Two calls.", "signature": "x"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {"city": "Rome"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "rain"},
                                                                     {"type": "text", "text": "12C"}]},
            {"type": "tool_result", "tool_use_id": "t1", "content": "timeout", "is_error": True},
            {"type": "text", "text": "  first  "},
            {"type": "text", "text": "<system-reminder>x</system-reminder>"},
        ]},
    ]
    assert translate(messages=turns).messages == [
        Message("user", "Weather in Paris and Rome?"),
        Message("assistant", "Checking.", thinking="Two calls.", tool_calls=[
            ToolCall("get_weather", {"city": "Paris"}, id="t1"), ToolCall("get_weather", {"city": "Rome"}, id="t2")]),
        Message("tool", "rain\n\n12C", tool_call_id="t2", tool_name="get_weather"),
        Message("tool", "Error: timeout", tool_call_id="t1", tool_name="get_weather"),
        Message("user", "  first  \n\n<system-reminder>x</system-reminder>"),
    ]


def test_clear_thinking_keeps_the_thinking_of_the_last_turns():
    turns = []
    for n in range(3):
        turns += [{"role": "user", "content": f"q{n}"},
                  {"role": "assistant", "content": [{"type": "thinking", "thinking": f"t{n}", "signature": ""},
                                                    {"type": "text", "text": f"a{n}"}]}]
    turns.append({"role": "user", "content": "q3"})

    def thinking(keep=None):
        edit = {"type": "clear_thinking_20251015"} | ({"keep": keep} if keep is not None else {})
        messages = translate(messages=turns, context_management={"edits": [edit]}).messages
        return [m.thinking for m in messages if m.role == "assistant"]

    assert thinking("all") == thinking({"type": "all"}) == ["t0", "t1", "t2"]
    assert thinking() == [None, None, "t2"]
    assert thinking({"type": "thinking_turns", "value": 2}) == [None, "t1", "t2"]
    assert thinking({"type": "thinking_turns", "value": 0}) == [None, None, None]
    with pytest.raises(BadRequest, match="keep"):
        thinking({"type": "thinking_turns", "value": "two"})


def test_tool_choices():
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    choices = {"auto": ToolChoice(), "none": ToolChoice("none"), "any": ToolChoice("required")}
    for kind, expected in choices.items():
        assert translate(tools=tools, tool_choice={"type": kind}).tool_choice == expected
    assert translate(tools=tools, tool_choice={"type": "tool", "name": "f"}).tool_choice == ToolChoice("named", "f")
    assert translate(tools=tools).tool_choice == ToolChoice()


def test_a_system_message_in_the_conversation_is_kept_in_place():
    turns = [{"role": "user", "content": "a"}, {"role": "system", "content": [{"type": "text", "text": "note"}]},
             {"role": "user", "content": "b"}]
    assert [m.role for m in translate(messages=turns).messages] == ["user", "system", "user"]
    with pytest.raises(BadRequest, match="messages.1.content.0"):
        translate(messages=[turns[0], {"role": "system", "content": [{"type": "image", "source": {}}]}])


def test_output_format_and_hidden_thinking():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert translate(output_config={"format": {"type": "json_schema", "schema": schema}}).format == schema
    assert translate(output_format={"type": "json_schema", "schema": schema}).format == schema
    assert translate(output_config={"effort": "low"}).format is None
    omitted = structure({"model": "m", "max_tokens": 1, "messages": [], "thinking": {
        "type": "enabled", "budget_tokens": 1024, "display": "omitted"}}, MessagesBody)
    assert thinking_hidden(omitted)


def test_content_blocks_follow_the_deltas_with_increasing_indexes():
    blocks = ContentBlocks()
    events = blocks.add(Delta(thinking="Let me"))
    events += blocks.add(Delta(thinking=" think."))
    events += blocks.add(Delta(content="Calling."))
    events += blocks.add(Delta(tool_calls=[ToolCall("f", {"x": 1}, id="call_1"), ToolCall("g", {}, id="call_2")]))
    events += blocks.add(Delta(content="Done."))
    events += blocks.close()
    assert blocks.content == [
        {"type": "thinking", "thinking": "Let me think.", "signature": ""},
        {"type": "text", "text": "Calling."},
        {"type": "tool_use", "id": "call_1", "name": "f", "input": {"x": 1}},
        {"type": "tool_use", "id": "call_2", "name": "g", "input": {}},
        {"type": "text", "text": "Done."},
    ]
    summary = [(name, data["index"], data.get("delta", data.get("content_block", {})).get("type")) for name, data in events]
    assert summary == [
        ("content_block_start", 0, "thinking"), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"), ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"), ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("content_block_start", 3, "tool_use"), ("content_block_delta", 3, "input_json_delta"),
        ("content_block_stop", 3, None),
        ("content_block_start", 4, "text"), ("content_block_delta", 4, "text_delta"), ("content_block_stop", 4, None),
    ]
    assert events[8][1]["content_block"]["input"] == {}  # the input arrives as JSON deltas
    assert json.loads(events[9][1]["delta"]["partial_json"]) == {"x": 1}
    assert stop_reason(Final("stop"), blocks) == "tool_use"
    assert stop_reason(Final("length"), blocks) == "max_tokens"
    assert stop_reason(Final("stop"), ContentBlocks()) == "end_turn"


def test_hidden_thinking_keeps_the_block_without_its_text():
    blocks = ContentBlocks(hide_thinking=True)
    events = blocks.add(Delta(thinking="secret", content="Answer"))
    assert blocks.content[0] == {"type": "thinking", "thinking": "", "signature": ""}
    assert "secret" not in json.dumps(events)


def test_usage_splits_the_prompt_into_evaluated_and_cached_tokens():
    final = Final("stop", prompt_tokens=120, prompt_eval_count=20, eval_count=7)
    assert usage(final) == {"input_tokens": 20, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 100,
                            "output_tokens": 7}
