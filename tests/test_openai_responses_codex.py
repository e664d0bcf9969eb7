"""End to end: /v1/responses takes requests shaped as Codex CLI sends them, through the official `openai` client.

The shapes are those `codex exec --oss` (Codex CLI 0.171.0) sends to an Ollama provider, seen on the wire: every
request streams, carries store false, include ["reasoning.encrypted_content"], a prompt_cache_key and
client_metadata; its tools are function tools (strict false), the namespace `multi_agent_v1` (function tools
grouped under a name) and the hosted web_search tool; its input is developer and user messages with ids, and from
the second turn on the previous turns' reasoning items (encrypted_content null), function_call items (a namespaced
one naming its namespace), custom_tool_call items (apply_patch) and their outputs, each with an id. The
descriptions and texts here are ours, shortened.
"""

import json

import openai
import pytest
from transformers import AutoTokenizer

from plugd.testing import transcripts as scenario
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.plugins import write_distribution

# A parser that calls every tool offered, each string parameter its schema requires set to "Paris": what the model
# is offered shows in what comes back.
PARSERS = """
    from plugd.hookspecs import ParsedPiece, Parser, hookimpl
    from plugd.types import ToolCall

    class CallsEveryTool:
        def __init__(self, tools):
            self.tools = tools

        def feed(self, text):
            return []

        def finish(self):
            return [ParsedPiece("tool_call", tool_call=ToolCall(t.name, dict.fromkeys(t.parameters.get("required", []),
                                                                                     "Paris")))
                    for t in self.tools]

    @hookimpl
    def plugd_parsers():
        return [Parser(name="calls-every-tool", create=lambda tools, prompt: CallsEveryTool(tools))]
"""


def _function(name, **properties):
    return {"type": "function", "name": name, "description": f"The {name} tool.", "strict": False,
            "parameters": {"type": "object", "properties": {p: {"type": kind} for p, kind in properties.items()},
                           "required": list(properties), "additionalProperties": False}}


EXEC_COMMAND = _function("exec_command", cmd="string")
MULTI_AGENT = {"type": "namespace", "name": "multi_agent_v1", "description": "Tools for sub-agents.",
               "tools": [_function("wait_agent", target="string"), _function("close_agent", target="string")]}
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
               "format": {"type": "text"}}
WEB_SEARCH = {"type": "web_search", "external_web_access": False}
CODEX_TOOLS = [EXEC_COMMAND, MULTI_AGENT, APPLY_PATCH, WEB_SEARCH]
CODEX_FIELDS = {"tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "store": False,
                "include": ["reasoning.encrypted_content"], "prompt_cache_key": "0199a213-81c0-7800-8aa1-bbab2a035a53",
                "extra_body": {"client_metadata": {"session_id": "0199a213-81c0-7800-8aa1-bbab2a035a53"}}}


def _message(role, text, item_id):
    return {"type": "message", "id": item_id, "role": role, "content": [{"type": "input_text", "text": text}]}


CODEX_FIRST_TURN = [_message("developer", "You are a coding agent.", "msg_1"),
                    _message("user", "<environment_context><cwd>/work</cwd></environment_context>", "msg_2"),
                    _message("user", "Add hello.txt", "msg_3")]


def _create(client, **fields):
    """A streamed request, as Codex sends it: the completed response."""
    events = list(client.responses.create(stream=True, **CODEX_FIELDS | fields))
    assert events[-1].type in ("response.completed", "response.incomplete"), events[-1]
    return events


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("tiny"), "qwen3", seed=0)


@pytest.fixture(scope="module")
def server(tmp_path_factory, checkpoint, modelfile_server):
    site = write_distribution(tmp_path_factory.mktemp("site"), "codex-parsers", {"codex_parsers": PARSERS},
                             {"codex-parsers": "codex_parsers"})
    return modelfile_server({"tiny": f"FROM {checkpoint}\nRENDERER jinja\nPARAMETER temperature 0\n",
                             "caller": "FROM tiny\nPARSER calls-every-tool\n"}, env={"PYTHONPATH": str(site)})


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="plugd", max_retries=0)


def test_namespace_members_and_custom_tools_are_offered_and_their_calls_come_back_as_codex_routes_them(server, client):
    events = _create(client, model="caller", input=CODEX_FIRST_TURN, tools=CODEX_TOOLS, max_output_tokens=4)
    calls = events[-1].response.output
    assert [(c.type, c.name, c.namespace) for c in calls] == [
        ("function_call", "exec_command", None), ("function_call", "wait_agent", "multi_agent_v1"),
        ("function_call", "close_agent", "multi_agent_v1"), ("custom_tool_call", "apply_patch", None)]  # no web_search
    assert json.loads(calls[1].arguments) == {"target": "Paris"}
    patch = calls[3]
    assert patch.input == "Paris" and patch.id.startswith("ctc_") and patch.call_id.startswith("call_")
    streamed = [e for e in events if e.type.startswith("response.custom_tool_call_input.")]
    assert [(e.type, e.item_id) for e in streamed] == [("response.custom_tool_call_input.delta", patch.id),
                                                       ("response.custom_tool_call_input.done", patch.id)]
    assert streamed[0].delta == streamed[1].input == "Paris"
    assert "left out hosted tools plugd cannot run: web_search" in server.log()


def test_a_codex_follow_up_renders_as_the_template_renders_the_same_conversation(client, checkpoint):
    """Every item Codex sends back, read as the conversation a Hugging Face client would send: proved by the prompt's
    length, counted by the template and tokenizer of the checkpoint."""
    follow_up = CODEX_FIRST_TURN + [
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Look."}],
         "encrypted_content": None},
        {"type": "function_call", "status": "completed", "id": "fc_1", "name": "exec_command",
         "arguments": '{"cmd":"ls"}', "call_id": "call_a"},
        {"type": "function_call", "status": "completed", "id": "fc_2", "name": "wait_agent",
         "namespace": "multi_agent_v1", "arguments": '{"target":"a1"}', "call_id": "call_b"},
        {"type": "function_call_output", "id": "fco_1", "call_id": "call_a", "output": "README.md\n"},
        {"type": "function_call_output", "id": "fco_2", "call_id": "call_b", "output": "a1 is done"},
        {"type": "custom_tool_call", "id": "ctc_1", "status": "completed", "call_id": "call_p", "name": "apply_patch",
         "input": "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"},
        {"type": "custom_tool_call_output", "id": "ctco_1", "call_id": "call_p", "output": "Success."},
    ]
    hf_calls = [[("exec_command", {"cmd": "ls"}), ("wait_agent", {"target": "a1"})],
                [("apply_patch", {"input": follow_up[-2]["input"]})]]
    hf_messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": CODEX_FIRST_TURN[1]["content"][0]["text"]},
        {"role": "user", "content": "Add hello.txt"},
        {"role": "assistant", "content": "", "reasoning_content": "Look.", "tool_calls": [
            {"type": "function", "function": {"name": name, "arguments": arguments}} for name, arguments in hf_calls[0]]},
        {"role": "tool", "content": "README.md\n"},
        {"role": "tool", "content": "a1 is done"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": name, "arguments": arguments}} for name, arguments in hf_calls[1]]},
        {"role": "tool", "content": "Success."},
    ]
    offered_patch = {"name": "apply_patch", "description": "Edit files with a patch.", "parameters": {
        "type": "object", "properties": {"input": {"type": "string", "description": "The text to pass to the tool."}},
        "required": ["input"]}}
    hf_tools = [{"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters")}}
                for tool in [EXEC_COMMAND, *MULTI_AGENT["tools"]]] + [{"type": "function", "function": offered_patch}]
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    prompt = tokenizer.apply_chat_template(hf_messages, tools=hf_tools, add_generation_prompt=True, tokenize=False)

    events = _create(client, model="tiny", input=follow_up, tools=CODEX_TOOLS, max_output_tokens=2)
    assert events[-1].response.usage.input_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))


def test_a_grammar_custom_tool_tells_the_model_its_grammar(client):
    grammar = {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'}
    plain = _create(client, model="tiny", input="Hi", tools=[APPLY_PATCH], max_output_tokens=1)
    with_grammar = _create(client, model="tiny", input="Hi", tools=[APPLY_PATCH | {"format": grammar}],
                           max_output_tokens=1)
    assert with_grammar[-1].response.usage.input_tokens > plain[-1].response.usage.input_tokens


# With the `agent_server` fixture's trained model, which answers its transcripts word for word only when the
# translation yields exactly the conversation it was trained on: here its tool inside a namespace, next to
# web_search, and the history sent back as Codex sends it.
WEATHER_NAMESPACE = {"type": "namespace", "name": "weather", "description": "Weather tools.", "tools": [
    {"type": "function", "name": scenario.WEATHER_TOOL.name, "description": scenario.WEATHER_TOOL.description,
     "strict": False, "parameters": scenario.WEATHER_TOOL.parameters}]}


def test_codex_round_trip_with_a_namespaced_tool(agent_server):
    agent = openai.OpenAI(base_url=f"{agent_server.url}/v1", api_key="plugd", max_retries=0)
    question = [_message("user", scenario.WEATHER_QUESTION, "msg_1")]
    tools = [WEATHER_NAMESPACE, WEB_SEARCH]
    reasoning, call = _create(agent, model="agent", input=question, tools=tools)[-1].response.output
    assert (call.type, call.namespace, call.name) == ("function_call", "weather", "get_weather")
    assert json.loads(call.arguments) == {"city": "Paris"}

    sent_back = [  # as Codex writes them back: ids kept, encrypted_content null, the namespace named
        {"type": "reasoning", "id": reasoning.id, "summary": [],
         "content": [{"type": "reasoning_text", "text": reasoning.content[0].text}], "encrypted_content": None},
        {"type": "function_call", "status": "completed", "id": call.id, "name": call.name, "namespace": "weather",
         "arguments": call.arguments, "call_id": call.call_id},
        {"type": "function_call_output", "id": "fco_1", "call_id": call.call_id, "output": scenario.WEATHER_RESULT},
    ]
    answered = _create(agent, model="agent", input=question + sent_back, tools=tools)[-1].response
    assert answered.status == "completed" and answered.output_text == scenario.WEATHER_ANSWER


def test_a_call_cut_short_comes_back_as_the_text_written_not_as_a_failed_response(agent_server):
    """A call the model left unfinished (cut here by max_output_tokens) is content, in a response that did not fail:
    a failed response with a server_error is what Codex resends, five times."""
    agent = openai.OpenAI(base_url=f"{agent_server.url}/v1", api_key="plugd", max_retries=0)
    question = [_message("user", scenario.WEATHER_QUESTION, "msg_1")]
    whole = _create(agent, model="agent", input=question, tools=[WEATHER_NAMESPACE])[-1].response
    cut = _create(agent, model="agent", input=question, tools=[WEATHER_NAMESPACE],
                  max_output_tokens=whole.usage.output_tokens - 2)[-1]
    assert cut.type == "response.incomplete" and cut.response.error is None
    reasoning, message = cut.response.output
    assert message.type == "message" and message.content[0].text.startswith('<tool_call>\n{"name": "get_weather"')
    assert reasoning.content[0].text == scenario.WEATHER_CALL_THINKING
