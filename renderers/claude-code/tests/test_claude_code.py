"""plugd-claude-code: Claude Code's runtime reminders no longer rewrite the history a prompt cache holds."""

import json
from pathlib import Path

import anthropic
import httpx
import pytest
from tokenizers import Tokenizer

from plugd.hookspecs import ClientRequest, ModelFiles
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.server import LiveServer
from plugd.types import Message
from plugd_claude_code import is_claude_code, with_reminders_in_place, without_billing_header

REFERENCE = Path(__file__).resolve().parents[3] / "tests" / "reference" / "chat_templates"
CLAUDE_CODE = {"user-agent": "claude-cli/2.0.14 (external, cli)", "x-app": "cli"}
GREEDY_ONE_TOKEN = {"temperature": 0, "num_predict": 1}


def _call(name, **arguments):
    return {"function": {"name": name, "arguments": arguments}}


def _tool(name, **properties):
    schema = {"type": "object", "properties": {p: {"type": t} for p, t in properties.items()}, "required": list(properties)}
    return {"type": "function", "function": {"name": name, "description": f"The {name} tool", "parameters": schema}}


TOOLS = [_tool("Read", file_path="string"), _tool("Edit", file_path="string", new_string="string"),
         _tool("Bash", command="string")]
REMINDER = "<system-reminder>\nTokens left: {}. Keep going with the task.\n</system-reminder>"
# A coding session as Claude Code sends it: each turn adds the model's call and its result, and a runtime
# reminder follows some tool results (Claude Code attaches one whenever its context or files change).
OPENING = [
    {"role": "system", "content": "You are Claude Code, a coding agent."},
    {"role": "user", "content": "The test for add() in calc.py fails. Fix it."},
]
STEPS = [
    [{"role": "assistant", "content": "", "thinking": "I should read the file first.",
      "tool_calls": [_call("Read", file_path="calc.py")]},
     {"role": "tool", "tool_name": "Read", "content": "def add(a, b):\n    return a - b\n"}],
    [{"role": "assistant", "content": "", "thinking": "The operator is wrong.",
      "tool_calls": [_call("Edit", file_path="calc.py", new_string="return a + b")]},
     {"role": "tool", "tool_name": "Edit", "content": "The file calc.py has been updated."},
     {"role": "user", "content": REMINDER.format(9000)}],
    [{"role": "assistant", "content": "Now I run the tests.", "thinking": "Check the fix.",
      "tool_calls": [_call("Bash", command="pytest -q")]},
     {"role": "tool", "tool_name": "Bash", "content": "1 passed in 0.01s"},
     {"role": "user", "content": REMINDER.format(8000)}],
]


def _turns():
    """The conversation as sent at each turn."""
    messages = list(OPENING)
    turns = [list(messages)]
    for step in STEPS:
        messages += step
        turns.append(list(messages))
    return turns


def test_claims_claude_code_by_its_headers():
    model = ModelFiles(config={})
    assert is_claude_code(ClientRequest("anthropic", CLAUDE_CODE, model, []))
    assert is_claude_code(ClientRequest("openai", {"X-App": "cli"}, model, []))
    assert not is_claude_code(ClientRequest("anthropic", {"user-agent": "Anthropic/Python 0.60.0"}, model, []))


def test_only_reminder_turns_after_the_first_user_turn_become_system_messages():
    reminder = REMINDER.format(1)
    messages = [Message("user", reminder + "\nHello"), Message("assistant", "Hi"), Message("user", reminder),
                Message("user", "A real question " + reminder), Message("user", f"{reminder}\n\n{reminder}")]
    roles = [m.role for m in with_reminders_in_place(messages)]
    assert roles == ["user", "assistant", "system", "user", "system"]


def test_the_billing_header_leaves_the_system_prompt_and_nothing_else():
    header = "x-anthropic-billing-header: cc_version=2.1.197.a41; cc_entrypoint=cli; cch=00000;"
    messages = [Message("system", f"{header}\n\nYou are Claude Code."), Message("system", header),
                Message("user", header)]
    assert [(m.role, m.content) for m in without_billing_header(messages)] == [
        ("system", "You are Claude Code."), ("user", header)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = write_checkpoint(tmp_path_factory.mktemp("qwen3"), "qwen3", tokenizer="qwen3")
    config_path = checkpoint / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = (REFERENCE / "qwen3.jinja").read_text()
    config_path.write_text(json.dumps(config))
    live = LiveServer(tmp_path_factory.mktemp("models"), env={"PLUGD_CLIENT_RENDERERS": "claude-code"})
    try:
        live.cli("create", "coder", "--from", str(checkpoint), check=True)
        live.tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
        yield live
    finally:
        live.stop()


def _session(server, headers):
    """Each turn's rendered prompt, its length in tokens, and the prompt tokens the runner evaluated for it."""
    server.cli("stop", "coder")  # a fresh runner: what it reuses can only come from this session
    results = []
    for messages in _turns():
        body = {"model": "coder", "messages": messages, "tools": TOOLS, "stream": False, "options": GREEDY_ONE_TOKEN}
        debug = httpx.post(f"{server.url}/api/chat", json=body | {"_debug_render_only": True}, headers=headers, timeout=60)
        prompt = debug.json()["_debug_info"]["rendered_template"]
        reply = httpx.post(f"{server.url}/api/chat", json=body, headers=headers, timeout=120).json()
        results.append((prompt, len(server.tokenizer.encode(prompt).ids), reply["prompt_eval_count"]))
    return results


def test_with_the_plugin_each_prompt_extends_the_last_and_the_runner_reuses_it(server):
    turns = _session(server, CLAUDE_CODE)
    for (previous, previous_tokens, _), (prompt, tokens, evaluated) in zip(turns, turns[1:]):
        assert prompt.startswith(previous)
        assert tokens - evaluated >= previous_tokens, "the runner re-evaluated part of the previous prompt"
    assert "<|im_start|>system\n<system-reminder>" in turns[-1][0]
    assert turns[-1][0].count("<think>") == 3, "every earlier turn keeps its reasoning"


def test_without_it_a_reminder_rewrites_the_history_before_it(server):
    turns = _session(server, {"user-agent": "python-httpx"})
    (before, before_tokens, _), (after, tokens, evaluated) = turns[1], turns[2]
    diverges_at = next(i for i, (a, b) in enumerate(zip(before, after)) if a != b)
    diverges_at = before.rfind("<", 0, diverges_at + 1)  # both sides go on with a tag: show where it starts
    # The reminder became the "last user query", so the first call's reasoning was dropped from the history.
    assert before[diverges_at:].startswith("<think>\nI should read the file first.")
    assert after[diverges_at:].startswith("<tool_call>")
    assert tokens - evaluated < before_tokens, "the runner could not reuse the whole previous prompt"


def _anthropic_messages(messages):
    """The conversation in Claude Code's own shape: content blocks, tool results and reminders in one user turn."""
    out = []
    for message in messages[1:]:  # the system prompt goes in `system`
        if message["role"] == "assistant":
            calls = [{"type": "tool_use", "id": f"toolu_{len(out)}_{i}", "name": c["function"]["name"],
                      "input": c["function"]["arguments"]} for i, c in enumerate(message["tool_calls"])]
            text = [{"type": "text", "text": message["content"]}] if message["content"] else []
            out.append({"role": "assistant", "content": [
                {"type": "thinking", "thinking": message["thinking"], "signature": ""}, *text, *calls]})
        elif message["role"] == "tool":
            call_id = next(b["id"] for b in out[-1]["content"] if b["type"] == "tool_use")
            out.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call_id, "content": message["content"]}]})
        elif out and out[-1]["role"] == "user":
            out[-1]["content"].append({"type": "text", "text": message["content"]})
        else:
            out.append({"role": "user", "content": message["content"]})
    return out


def test_a_claude_code_session_over_the_messages_api_reuses_every_previous_prompt(server):


    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]

    def session(headers):
        client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, default_headers=headers)
        server.cli("stop", "coder")  # a fresh runner: what it reuses can only come from this session
        usages = []
        for messages in _turns():
            reply = client.messages.create(model="coder", max_tokens=1, system=OPENING[0]["content"], tools=tools,
                                           messages=_anthropic_messages(messages))
            usages.append((reply.usage.input_tokens + reply.usage.cache_read_input_tokens,
                           reply.usage.cache_read_input_tokens))
        return usages

    with_plugin = session(CLAUDE_CODE)
    for (previous_total, _), (_, reused) in zip(with_plugin, with_plugin[1:]):
        assert reused >= previous_total
    without = session({"user-agent": "Anthropic/Python"})
    assert without[2][1] < without[1][0], "a reminder rewrote the history, so the runner could not reuse it"


# Claude Code's requests as its 2.1.197 build writes them (texts ours): the system prompt's first block is the
# billing header, whose version hash follows the session's first user message; its own prompt and its tools follow.
CLAUDE_CODE_PROMPT = "You are Claude Code, Anthropic's official CLI for Claude.\n" + "\n".join(
    f"- Rule {i}: prefer small, tested changes to file number {i} of the repository." for i in range(60))
CLAUDE_CODE_TOOLS = [
    {"name": name, "description": f"{name} a file or a command. " * 8, "input_schema": {
        "$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "additionalProperties": False,
        "properties": {"path": {"type": "string", "description": "An absolute path."}}, "required": ["path"]}}
    for name in ("Bash", "Glob", "Grep", "Read", "Edit", "Write")]


def _claude_code_request(first_message: str, version_hash: str) -> dict:
    billing = f"x-anthropic-billing-header: cc_version=2.1.197.{version_hash}; cc_entrypoint=cli; cch=00000;"
    return {"model": "coder", "max_tokens": 1, "tools": CLAUDE_CODE_TOOLS, "metadata": {"user_id": "user_1_session_2"},
            "system": [{"type": "text", "text": billing},
                       {"type": "text", "text": CLAUDE_CODE_PROMPT, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": first_message, "cache_control": {"type": "ephemeral"}}]}]}


@pytest.mark.parametrize(("headers", "shared"), [(CLAUDE_CODE, "most"), ({"user-agent": "Anthropic/Python"}, "little")])
def test_two_sessions_share_the_cached_system_prompt_and_tools(server, headers, shared):
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0,
                                 default_headers=headers | {"anthropic-beta": "claude-code-20250219"})
    server.cli("stop", "coder")  # a fresh runner: what it reuses can only come from these two sessions
    client.messages.create(**_claude_code_request("Fix the failing test in calc.py.", "a41"))
    second = client.messages.create(**_claude_code_request("Explain what utils.py does.", "7fe")).usage
    cached = second.cache_read_input_tokens / (second.input_tokens + second.cache_read_input_tokens)
    if shared == "most":
        assert cached > 0.9, f"only {cached:.0%} of the second session's prompt was reused"
    else:  # without the plugin the billing header, first in the prompt, differs: hardly anything is shared
        assert cached < 0.1, f"{cached:.0%} of the second session's prompt was reused"
