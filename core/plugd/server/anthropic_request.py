"""Anthropic Messages request bodies, translated into the pipeline's dialect-neutral ChatRequest."""

from __future__ import annotations

import re
from typing import Any

import attrs
from attrs import define

from plugd.chat.pipeline import ChatRequest, ToolChoice
from plugd.server.anthropic_media import image_media
from plugd.server.bodies import BadRequest
from plugd.types import Message, Think, Tool, ToolCall

_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")
# Fields that ask for something only Anthropic's servers do; ignoring them would quietly change the answer.
_SERVER_SIDE = ("mcp_servers", "container")


@define(kw_only=True)
class ConversationBody:
    """What /v1/messages and /v1/messages/count_tokens share. Blocks are checked by hand: their shape varies by type."""

    model: str
    messages: list[Any]
    system: Any = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    thinking: Any = None
    output_config: Any = None
    output_format: Any = None  # the structured-outputs beta's name for output_config.format
    mcp_servers: Any = None
    container: Any = None
    context_management: Any = None


@define(kw_only=True)
class MessagesBody(ConversationBody):
    max_tokens: int
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


def conversation_request(body: ConversationBody, headers: dict[str, str]) -> ChatRequest:
    """The ChatRequest for `body`'s conversation, tools and thinking, with no generation options."""
    for name in _SERVER_SIDE:
        if getattr(body, name) is not None:
            raise BadRequest(f"{name}: not supported by a local server")
    if not body.messages:
        raise BadRequest("messages: at least one message is required")
    return ChatRequest(
        model=body.model,
        messages=system_messages(body.system) + with_thinking_cleared(conversation(body.messages),
                                                                       body.context_management),
        tools=tools(body.tools),
        tool_choice=tool_choice(body.tool_choice),
        parallel_tool_calls=not (body.tool_choice or {}).get("disable_parallel_tool_use", False),
        think=think(body.thinking),
        format=output_format(body),
        dialect="anthropic",
        headers=headers,
    )


def messages_request(body: MessagesBody, headers: dict[str, str]) -> ChatRequest:
    if body.max_tokens < 0:
        raise BadRequest("max_tokens: must be at least 0")
    chat = conversation_request(body, headers)
    options = {"num_predict": body.max_tokens, "temperature": body.temperature, "top_p": body.top_p,
               "top_k": body.top_k, "stop": body.stop_sequences}
    chat.options = {name: value for name, value in options.items() if value is not None}
    return chat


def thinking_hidden(body: ConversationBody) -> bool:
    """Whether the client asked for thinking blocks without their text (thinking.display "omitted")."""
    return isinstance(body.thinking, dict) and body.thinking.get("display") == "omitted"


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """Content as a list of typed blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where}: content must be a string or a list of content blocks")
    for index, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise BadRequest(f"{where}.{index}: a content block must be an object with a type")
    return content


def _string(block: dict[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise BadRequest(f"{where}.{key}: must be a string")
    return value


def _unsupported(kind: str, where: str) -> BadRequest:
    return BadRequest(f"{where}: content blocks of type {kind!r} are not supported here")


def _texts(content: Any, where: str) -> str:
    """Text-only content (a system prompt or system message), its blocks joined by blank lines."""
    texts = []
    for index, block in enumerate(_blocks(content, where)):
        if block["type"] != "text":
            raise _unsupported(block["type"], f"{where}.{index}")
        texts.append(_string(block, "text", f"{where}.{index}"))
    return "\n\n".join(texts)


def system_messages(system: Any) -> list[Message]:
    """One system message per text block (the pipeline joins the leading ones), none for an absent or empty prompt."""
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [Message("system", system)]
    return [Message("system", _texts([block], f"system.{index}")) for index, block in enumerate(_blocks(system, "system"))]


def conversation(messages: list[Any]) -> list[Message]:
    tool_names: dict[str, str] = {}  # tool_use id -> tool name, for the tool_result blocks that answer them
    out: list[Message] = []
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        if not isinstance(message, dict):
            raise BadRequest(f"{where}: a message must be an object with role and content")
        role, content = message.get("role"), message.get("content")
        if role == "user":
            out += _user_turn(_blocks(content, f"{where}.content"), tool_names, f"{where}.content")
        elif role == "assistant":
            out.append(_assistant_turn(_blocks(content, f"{where}.content"), tool_names, f"{where}.content"))
        elif role == "system":
            out.append(Message("system", _texts(content, f"{where}.content")))
        else:
            raise BadRequest(f"{where}.role: {role!r} is not one of 'user', 'assistant', 'system'")
    if messages[-1].get("role") == "assistant":
        raise BadRequest("messages: a final assistant message (prefill) is not supported; end with a user message")
    return out


def _user_turn(blocks: list[dict[str, Any]], tool_names: dict[str, str], where: str) -> list[Message]:
    """Tool results become tool messages, in order; the turn's text and images follow as one user message."""
    results, texts, images = [], [], []
    for index, block in enumerate(blocks):
        kind, at = block["type"], f"{where}.{index}"
        if kind == "text":
            texts.append(_string(block, "text", at))
        elif kind == "image":
            images.append(image_media(block, at))
        elif kind == "tool_result":
            results.append(_tool_result(block, tool_names, at))
        elif kind in ("tool_use", "thinking", "redacted_thinking"):
            raise BadRequest(f"{at}: {kind} blocks belong in assistant turns")
        else:
            raise _unsupported(kind, at)
    if texts or images or not results:
        results.append(Message("user", "\n\n".join(texts), images=images))
    return results


def _tool_result(block: dict[str, Any], tool_names: dict[str, str], where: str) -> Message:
    call_id = block.get("tool_use_id")
    if call_id not in tool_names:
        raise BadRequest(f"{where}.tool_use_id: {call_id!r} matches no tool_use block in an earlier assistant turn")
    texts, images = [], []
    for index, inner in enumerate(_blocks(block.get("content", ""), f"{where}.content")):
        at = f"{where}.content.{index}"
        if inner["type"] == "text":
            texts.append(_string(inner, "text", at))
        elif inner["type"] == "image":
            images.append(image_media(inner, at))
        else:
            raise _unsupported(inner["type"], at)
    text = "\n\n".join(texts)
    if block.get("is_error"):
        text = f"Error: {text}"
    return Message("tool", text, images=images, tool_call_id=call_id, tool_name=tool_names[call_id])


def _assistant_turn(blocks: list[dict[str, Any]], tool_names: dict[str, str], where: str) -> Message:
    texts, thinking, calls = [], [], []
    for index, block in enumerate(blocks):
        kind, at = block["type"], f"{where}.{index}"
        if kind == "text":
            texts.append(_string(block, "text", at))
        elif kind == "thinking":
            thinking.append(_string(block, "thinking", at))
        elif kind == "redacted_thinking":
            continue  # encrypted by Anthropic for its own models: there is no text to give a local one
        elif kind == "tool_use":
            call = _tool_use(block, at)
            tool_names[call.id] = call.name
            calls.append(call)
        elif kind in ("tool_result", "image"):
            raise BadRequest(f"{at}: {kind} blocks belong in user turns")
        else:
            raise _unsupported(kind, at)
    return Message("assistant", "\n\n".join(texts), thinking="\n\n".join(thinking) or None, tool_calls=calls)


def _tool_use(block: dict[str, Any], where: str) -> ToolCall:
    call_id, name = _string(block, "id", where), _string(block, "name", where)
    arguments = block.get("input")
    if not isinstance(arguments, dict):
        raise BadRequest(f"{where}.input: must be an object")
    return ToolCall(name, arguments, id=call_id)


def with_thinking_cleared(messages: list[Message], context_management: Any) -> list[Message]:
    """The conversation after context_management's edits; only clear_thinking, the one that needs no server state.

    It keeps the thinking of the last `keep` assistant turns (1 unless told; "all" keeps every one).
    """
    if context_management is None:
        return messages
    edits = context_management.get("edits", []) if isinstance(context_management, dict) else None
    if not isinstance(edits, list):
        raise BadRequest("context_management.edits: must be a list of edits")
    for index, edit in enumerate(edits):
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind != "clear_thinking_20251015":
            raise BadRequest(f"context_management.edits.{index}: {kind!r} is not supported by a local server")
        keep = edit.get("keep", {"type": "thinking_turns", "value": 1})
        if keep == "all" or keep == {"type": "all"}:
            continue
        turns = keep.get("value") if isinstance(keep, dict) and keep.get("type") == "thinking_turns" else None
        if not isinstance(turns, int) or isinstance(turns, bool) or turns < 0:
            raise BadRequest(f"context_management.edits.{index}.keep: must be \"all\" or a number of thinking_turns")
        assistant = [i for i, m in enumerate(messages) if m.role == "assistant"]
        cleared = set(assistant[: max(len(assistant) - turns, 0)])
        messages = [attrs.evolve(m, thinking=None) if i in cleared else m for i, m in enumerate(messages)]
    return messages


def tools(declared: list[Any] | None) -> list[Tool]:
    out: list[Tool] = []
    for index, tool in enumerate(declared or []):
        where = f"tools.{index}"
        if not isinstance(tool, dict):
            raise BadRequest(f"{where}: a tool must be an object with name, description and input_schema")
        kind, name = tool.get("type"), tool.get("name")
        if kind not in (None, "custom"):
            raise BadRequest(f"{where}: server tool {name!r} of type {kind!r} is not supported; "
                             "declare client tools with name, description and input_schema")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise BadRequest(f"{where}.name: must be 1 to 128 letters, digits, '_' or '-', not {name!r}")
        description = tool.get("description", "")
        if not isinstance(description, str):
            raise BadRequest(f"{where}.description: must be a string")
        if tool.get("strict"):
            raise BadRequest(f"{where}.strict: schema-conformant tool input cannot be enforced")
        out.append(Tool(name, description, _input_schema(tool.get("input_schema"), f"{where}.input_schema")))
    return out


def _input_schema(schema: Any, where: str) -> dict[str, Any]:
    """A JSON Schema object; the pipeline checks, for every dialect alike, that it describes an object."""
    if not isinstance(schema, dict):
        raise BadRequest(f"{where}: must be a JSON Schema object")
    return schema


def tool_choice(choice: Any) -> ToolChoice:
    if choice is None:
        return ToolChoice()
    if not isinstance(choice, dict):
        raise BadRequest("tool_choice: must be an object with a type")
    kind = choice.get("type")
    if kind == "auto":
        return ToolChoice()
    if kind == "none":
        return ToolChoice("none")
    if kind == "any":
        return ToolChoice("required")
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            raise BadRequest("tool_choice.name: must name a tool")
        return ToolChoice("named", name)
    raise BadRequest(f"tool_choice.type: {kind!r} is not one of 'auto', 'any', 'tool', 'none'")


def think(thinking: Any) -> Think:
    """enabled: think; disabled: don't; adaptive leaves it to the model, which for a local model is its default."""
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise BadRequest("thinking.budget_tokens: must be a positive integer")
        return True
    if kind == "disabled":
        return False
    if kind == "adaptive":
        return None
    raise BadRequest(f"thinking.type: {kind!r} is not one of 'enabled', 'disabled', 'adaptive'")


def output_format(body: ConversationBody) -> dict[str, Any] | None:
    """The JSON Schema of output_config.format (or the beta's output_format), for the pipeline's `format`."""
    if body.output_config is not None and not isinstance(body.output_config, dict):
        raise BadRequest("output_config: must be an object")
    fmt = (body.output_config or {}).get("format") or body.output_format
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise BadRequest("output_config.format: must be {\"type\": \"json_schema\", \"schema\": {...}}")
    return fmt["schema"]
