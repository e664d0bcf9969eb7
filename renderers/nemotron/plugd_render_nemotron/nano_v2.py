"""Nemotron Nano v2: `<SPECIAL_10>System` / `<SPECIAL_11>User|Assistant` turns, `<TOOLCALL>[...]` JSON calls.

Reproduces the upstream chat template byte for byte, with these choices
where it has none or drops a message:

- thinking: an explicit `think` wins; with `think` None the last `/think` or
  `/no_think` in a user or system message decides, as upstream (on by default).
  The markers are removed from the rendered text, as upstream.
- a system (or developer) message after the first one is rendered in place as
  a system turn, `<SPECIAL_10>System\\n{content}\\n\\n`, the shape of the leading
  system turn; upstream drops it silently.
- a final assistant message is continued, as upstream: its content follows the
  generation prompt (its tool calls, which upstream drops too, are not rendered).
"""

from __future__ import annotations

from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.types import Message, Prompt, Think, Tool, ToolCall

from .conversation import prepared
from .templating import tojson

NAME = "nemotron-nano-v2"

SYSTEM = "<SPECIAL_10>System\n"
USER = "<SPECIAL_11>User\n"
ASSISTANT = "<SPECIAL_11>Assistant\n"
END_OF_TURN = "\n<SPECIAL_12>\n"
THINK_ON = "<think>\n"
THINK_OFF = "<think></think>"

TOOLS_INTRO = "You can use the following tools to assist the user if required:\n<AVAILABLE_TOOLS>["
TOOLS_OUTRO = (
    "]</AVAILABLE_TOOLS>\n\n"
    "If you decide to call any tool(s), use the following format:\n"
    '<TOOLCALL>[{{"name": "tool_name1", "arguments": "tool_args1"}}, '
    '{{"name": "tool_name2", "arguments": "tool_args2"}}]</TOOLCALL>\n\n'
    "The user will execute tool-calls and return responses from tool(s) in this format:\n"
    '<TOOL_RESPONSE>[{{"tool_response1"}}, {{"tool_response2"}}]</TOOL_RESPONSE>\n\n'
    "Based on the tool responses, you can call additional tools if needed, correct tool calls if any errors are "
    "found, or just respond to the user."
)


def detect(model: ModelFiles) -> bool:
    template = model.chat_template or ""
    return "<SPECIAL_10>System" in template and "<TOOLCALL>" in template


def render(request: RenderRequest) -> Prompt:
    messages = prepared(request.messages, NAME)
    thinking = _thinking(messages, request.think)
    system = _without_markers(messages[0].content) if messages and messages[0].role == "system" else ""
    turns = messages[1:] if messages and messages[0].role == "system" else messages
    out = [SYSTEM, system]
    if request.tools:
        out += ["\n\n" if system else "", TOOLS_INTRO, ", ".join(_tool_json(t) for t in request.tools), TOOLS_OUTRO]
    out.append("\n\n")
    continued = turns[-1] if turns and turns[-1].role == "assistant" else None
    if continued:
        turns = turns[:-1]
    for i, message in enumerate(turns):
        if message.role == "user":
            out += [USER, _without_markers(message.content), "\n"]
        elif message.role == "system":
            out += [SYSTEM, _without_markers(message.content), "\n\n"]
        elif message.role == "tool":
            if i == 0 or turns[i - 1].role != "tool":
                out.append(USER + "<TOOL_RESPONSE>[")
            out.append(message.content)
            out.append(", " if i + 1 < len(turns) and turns[i + 1].role == "tool" else "]</TOOL_RESPONSE>")
        else:
            out.append(_assistant(message))
    out += [ASSISTANT, THINK_ON if thinking else THINK_OFF]
    if continued:
        out.append(continued.content.strip())
    return Prompt("".join(out))


def _thinking(messages: list[Message], think: Think) -> bool:
    if think is not None:
        return bool(think)
    enabled = True
    for message in messages:
        if message.role in ("user", "system"):
            if "/think" in message.content:
                enabled = True
            elif "/no_think" in message.content:
                enabled = False
    return enabled


def _without_markers(text: str) -> str:
    return text.replace("/think", "").replace("/no_think", "").strip()


def _tool_json(tool: Tool) -> str:
    return tojson({"name": tool.name, "description": tool.description, "parameters": tool.parameters})


def _assistant(message: Message) -> str:
    content = message.content
    if "</think>" in content:
        content = content.split("</think>")[1].strip()  # upstream keeps what follows the FIRST </think>
    text = ASSISTANT + content.strip()
    if message.tool_calls:
        text += ("\n" if content.strip() else "") + _tool_calls(message.tool_calls)
    return text + END_OF_TURN


def _tool_calls(calls: list[ToolCall]) -> str:
    items = ", ".join(f'{{"name": "{call.name}", "arguments": {tojson(call.arguments)}}}' for call in calls)
    return f"<TOOLCALL>[{items}]</TOOLCALL>"
