"""OpenAI's Responses API (/v1/responses), stateless: translated onto the shared chat pipeline.

plugd stores no responses. A request must carry its whole conversation as
`input`; `previous_response_id`, `conversation` and `background` are refused,
and every response says `"store": false` whatever the request asked, so that a
client knows it cannot fetch the response back later.

Translation, input side: `instructions` becomes a leading system message;
consecutive reasoning, assistant message and function_call items become one
assistant turn (its thinking, content and tool calls), as one response's
output is one turn of the model; a function_call_output becomes a tool message
named after the call it answers. Output side: thinking, text and tool calls
become reasoning, message and function_call items in the order the model
produced them.
"""

from __future__ import annotations

import copy
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from attrs import define
from litestar import Request, Response, delete, get, post
from litestar.exceptions import NotFoundException

from plugd.chat import pipeline
from plugd.chat.pipeline import ChatRequest, Delta, Final, ToolChoice, UnparseableOutput
from plugd.media import data_url_image
from plugd.parsing import parse_json_arguments
from plugd.scheduler.runner_client import RunnerError
from plugd.server.bodies import BadRequest, read_body
from plugd.server.sse import SSE, sse_event, streamed
from plugd.types import Media, Message, Think, Tool, ToolCall

log = logging.getLogger(__name__)

NOT_STORED = "plugd does not store responses; send the whole conversation as input"
# Families think at three levels at most: the efforts above "high" ask for the most there is.
_EFFORTS: dict[str, Think] = {"none": False, "minimal": False, "low": "low", "medium": "medium", "high": "high",
                              "xhigh": "high", "max": "high"}


@define(kw_only=True)
class ResponsesBody:
    """The fields of a Responses request that plugd reads; the others are accepted and ignored."""

    model: str
    input: Any = None  # a string, or a list of input items
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    truncation: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None


def _string(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise BadRequest(f"{where} needs {key!r} as a string")
    return value


def _image(part: dict[str, Any]) -> Media:
    if part.get("file_id"):
        raise BadRequest("input_image by file_id is not supported: plugd has no file store; send a data: URL")
    try:
        return data_url_image(_string(part, "image_url", "input_image"))
    except ValueError as exc:
        raise BadRequest(f"input_image: {exc}") from None


def _content(content: Any, where: str) -> tuple[str, list[Media]]:
    """The text (parts joined as a chat template joins them: back to back) and images of a message's content."""
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content parts")
    texts: list[str] = []
    images: list[Media] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text"):
            texts.append(_string(part, "text", kind))
        elif kind == "input_image":
            images.append(_image(part))
        else:
            raise BadRequest(f"content part type {kind!r} is not supported")
    return "".join(texts), images


def _part_texts(parts: Any, where: str) -> list[str]:
    if parts is None:
        return []
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        raise BadRequest(f"{where} must be a list of parts")
    return [_string(p, "text", where) for p in parts]


class _InputReader:
    """Turns input items into plugd Messages, one assistant turn from each run of assistant-side items."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self._turn: Message | None = None  # the assistant turn that following assistant-side items add to
        self._call_names: dict[str, str] = {}
        self._readers: dict[str, Callable[[dict[str, Any]], None]] = {
            "message": self._message,
            "reasoning": self._reasoning,
            "function_call": self._function_call,
            "function_call_output": self._function_call_output,
        }

    def read(self, item: dict[str, Any]) -> None:
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "item_reference":
            raise BadRequest(f"item_reference is not supported: {NOT_STORED}")
        reader = self._readers.get(kind)
        if reader is None:
            raise BadRequest(f"input item type {kind!r} is not supported")
        reader(item)

    def _assistant_turn(self, fresh: bool) -> Message:
        if self._turn is None or fresh:
            self._turn = Message("assistant")
            self.messages.append(self._turn)
        return self._turn

    def _message(self, item: dict[str, Any]) -> None:
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise BadRequest(f"invalid message role {role!r}")
        text, images = _content(item.get("content"), "message content")
        if role == "assistant":
            turn = self._assistant_turn(fresh=bool(self._turn and (self._turn.content or self._turn.tool_calls)))
            turn.content, turn.images = text, turn.images + images
        else:
            self._turn = None
            self.messages.append(Message(role, text, images=images))

    def _reasoning(self, item: dict[str, Any]) -> None:
        """The raw reasoning text when the item has it, else its summary."""
        text = "".join(_part_texts(item.get("content"), "reasoning content"))
        text = text or "\n\n".join(_part_texts(item.get("summary"), "reasoning summary"))
        turn = self._assistant_turn(fresh=bool(self._turn and (self._turn.content or self._turn.tool_calls
                                                               or self._turn.thinking)))
        turn.thinking = text or None

    def _function_call(self, item: dict[str, Any]) -> None:
        call_id, name = _string(item, "call_id", "function_call"), _string(item, "name", "function_call")
        arguments = item.get("arguments", "")
        if not isinstance(arguments, str):
            raise BadRequest("function_call arguments must be a JSON string")
        try:
            parsed = parse_json_arguments(arguments, name)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        self._call_names[call_id] = name
        self._assistant_turn(fresh=False).tool_calls.append(ToolCall(name, parsed, id=call_id))

    def _function_call_output(self, item: dict[str, Any]) -> None:
        call_id = _string(item, "call_id", "function_call_output")
        name = self._call_names.get(call_id)
        if name is None:
            raise BadRequest(f"function_call_output call_id {call_id!r} answers no earlier function_call")
        text, images = _content(item.get("output"), "function_call_output output")
        self._turn = None
        self.messages.append(Message("tool", text, images=images, tool_name=name, tool_call_id=call_id))


def _messages(body: ResponsesBody) -> list[Message]:
    items = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    if not isinstance(items, list) or not items:
        raise BadRequest("input must be a string or a non-empty list of items")
    reader = _InputReader()
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{index}] must be an object")
        try:
            reader.read(item)
        except BadRequest as exc:
            raise BadRequest(f"input[{index}]: {exc}") from None
    head = [Message("system", body.instructions)] if body.instructions else []
    return head + reader.messages


def _tools(tools: list[dict[str, Any]]) -> list[Tool]:
    out = []
    for tool in tools:
        if tool.get("type") != "function":
            raise BadRequest(f"tool type {tool.get('type')!r} is not supported: plugd serves function tools only")
        description, parameters = tool.get("description") or "", tool.get("parameters") or {}
        if not isinstance(description, str) or not isinstance(parameters, dict):
            raise BadRequest("a function tool's description must be a string and its parameters a JSON Schema object")
        out.append(Tool(_string(tool, "name", "a function tool"), description, parameters))
    return out


def _tool_choice(value: Any) -> ToolChoice:
    if value is None or value in ("none", "auto", "required"):
        return ToolChoice(value or "auto")
    if isinstance(value, dict) and value.get("type") == "function":
        return ToolChoice("named", _string(value, "name", "tool_choice"))
    kind = value.get("type") if isinstance(value, dict) else value
    raise BadRequest(f"tool_choice {kind!r} is not supported: use none, auto, required or a function")


def _think(reasoning: dict[str, Any] | None) -> Think:
    effort = (reasoning or {}).get("effort")
    if effort is None:
        return None
    if effort not in _EFFORTS:
        raise BadRequest(f"reasoning effort {effort!r} is not supported: use {', '.join(_EFFORTS)}")
    return _EFFORTS[effort]


def _text_format(text: dict[str, Any] | None) -> dict[str, Any]:
    text_format = (text or {}).get("format") or {"type": "text"}
    if not isinstance(text_format, dict) or text_format.get("type") not in ("text", "json_object", "json_schema"):
        kind = text_format.get("type") if isinstance(text_format, dict) else text_format
        raise BadRequest(f"text.format {kind!r} is not supported: use text, json_object or json_schema")
    if text_format["type"] == "json_schema" and not isinstance(text_format.get("schema"), dict):
        raise BadRequest("text.format json_schema needs a 'schema' object")
    return text_format


def _pipeline_format(text_format: dict[str, Any]) -> Any:
    return {"text": None, "json_object": "json", "json_schema": text_format.get("schema")}[text_format["type"]]


def _refuse_unservable(body: ResponsesBody) -> None:
    if body.previous_response_id:
        raise BadRequest(f"previous_response_id is not supported: {NOT_STORED}")
    if body.conversation is not None:
        raise BadRequest(f"conversation is not supported: {NOT_STORED}")
    if body.background:
        raise BadRequest(f"background responses are not supported: {NOT_STORED}")
    if body.truncation not in (None, "auto", "disabled"):
        raise BadRequest(f"truncation {body.truncation!r} is not supported: use auto or disabled")
    if body.max_output_tokens is not None and body.max_output_tokens < 1:
        raise BadRequest("max_output_tokens must be at least 1")


def _options(body: ResponsesBody) -> dict[str, Any]:
    given = {"num_predict": body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p}
    return {name: value for name, value in given.items() if value is not None}


def chat_request(body: ResponsesBody, headers: dict[str, str]) -> ChatRequest:
    """The pipeline request for a Responses body; a 400 for anything plugd cannot serve as asked."""
    _refuse_unservable(body)
    return ChatRequest(
        model=body.model,
        messages=_messages(body),
        tools=_tools(body.tools or []),
        tool_choice=_tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        think=_think(body.reasoning),
        options=_options(body),
        format=_pipeline_format(_text_format(body.text)),
        dialect="openai",
        headers=headers,
    )


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


def _usage(final: Final) -> dict[str, Any]:
    return {
        "input_tokens": final.prompt_tokens,
        "input_tokens_details": {"cached_tokens": final.cached_tokens},
        "output_tokens": final.eval_count,
        "output_tokens_details": {"reasoning_tokens": 0},  # the runner counts tokens, not which kind they were
        "total_tokens": final.prompt_tokens + final.eval_count,
    }


_TEXT_KINDS = {  # output item type -> its content part type and the stream events of that part's text
    "reasoning": ("reasoning_text", "response.reasoning_text"),
    "message": ("output_text", "response.output_text"),
}


class ResponseBuilder:
    """The response object as it grows from the pipeline's events, and the stream events that announce each step.

    Non-streaming requests use the same builder and keep only `response`.
    """

    def __init__(self, body: ResponsesBody):
        self.response: dict[str, Any] = {
            "id": _new_id("resp"),
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "metadata": body.metadata or {},
            "model": body.model,
            "output": [],
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": {"effort": (body.reasoning or {}).get("effort"), "summary": None},
            "store": False,
            "temperature": body.temperature,
            "text": {"format": _text_format(body.text)},
            "tool_choice": body.tool_choice or "auto",
            "tools": body.tools or [],
            "top_p": body.top_p,
            "truncation": body.truncation or "disabled",
            "usage": None,
            "user": body.user,
        }
        self._sequence = 0
        self._open: dict[str, Any] | None = None  # the reasoning or message item whose text is streaming

    @property
    def _output(self) -> list[dict[str, Any]]:
        return self.response["output"]

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _lifecycle(self, kind: str) -> dict[str, Any]:
        return self._event(kind, response=copy.deepcopy(self.response))

    def start(self) -> list[dict[str, Any]]:
        return [self._lifecycle("response.created"), self._lifecycle("response.in_progress")]

    def feed(self, delta: Delta) -> list[dict[str, Any]]:
        events = []
        if delta.thinking:
            events += self._text("reasoning", delta.thinking)
        if delta.content:
            events += self._text("message", delta.content)
        for call in delta.tool_calls:
            events += self._close("completed") + self._function_call(call)
        return events

    def finish(self, final: Final) -> list[dict[str, Any]]:
        incomplete = final.done_reason == "length"
        events = self._close("incomplete" if incomplete else "completed")
        self.response |= {
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "usage": _usage(final),
            "completed_at": None if incomplete else int(time.time()),
        }
        return events + [self._lifecycle(f"response.{self.response['status']}")]

    def fail(self, message: str) -> list[dict[str, Any]]:
        events = self._close("incomplete")
        self.response |= {"status": "failed", "error": {"code": "server_error", "message": message}}
        return events + [self._lifecycle("response.failed")]

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        events = []
        if self._open is None or self._open["type"] != kind:
            events += self._close("completed") + self._open_item(kind)
        item = self._open
        item["content"][0]["text"] += text
        extra = {"logprobs": []} if kind == "message" else {}
        events.append(self._event(f"{_TEXT_KINDS[kind][1]}.delta", item_id=item["id"], output_index=len(self._output) - 1,
                                  content_index=0, delta=text, **extra))
        return events

    def _open_item(self, kind: str) -> list[dict[str, Any]]:
        if kind == "reasoning":
            item = {"id": _new_id("rs"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = {"id": _new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress", "content": []}
            part = {"type": "output_text", "text": "", "annotations": []}
        self._output.append(item)
        index = len(self._output) - 1
        events = [self._event("response.output_item.added", output_index=index, item=copy.deepcopy(item)),
                  self._event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                              part=dict(part))]
        item["content"].append(part)
        self._open = item
        return events

    def _close(self, status: str) -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        item["status"] = status
        part, index = item["content"][0], len(self._output) - 1
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        extra = {"logprobs": []} if item["type"] == "message" else {}
        return [self._event(f"{_TEXT_KINDS[item['type']][1]}.done", **where, text=part["text"], **extra),
                self._event("response.content_part.done", **where, part=dict(part)),
                self._event("response.output_item.done", output_index=index, item=copy.deepcopy(item))]

    def _function_call(self, call: ToolCall) -> list[dict[str, Any]]:
        arguments = json.dumps(call.arguments, ensure_ascii=False)
        item = {"id": _new_id("fc"), "type": "function_call", "call_id": call.id, "name": call.name,
                "arguments": arguments, "status": "completed"}
        self._output.append(item)
        index = len(self._output) - 1
        where = {"item_id": item["id"], "output_index": index}
        return [self._event("response.output_item.added", output_index=index,
                            item=item | {"arguments": "", "status": "in_progress"}),
                self._event("response.function_call_arguments.delta", **where, delta=arguments),
                self._event("response.function_call_arguments.done", **where, name=call.name, arguments=arguments),
                self._event("response.output_item.done", output_index=index, item=dict(item))]


def _sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(sse_event(event, event=event["type"]) for event in events)


async def _stream(builder: ResponseBuilder, first: Delta | Final, events: AsyncIterator[Delta | Final]):
    event = first
    try:
        yield _sse(builder.start())
        while not isinstance(event, Final):
            if out := builder.feed(event):
                yield _sse(out)
            event = await anext(events)
        yield _sse(builder.finish(event))
    except (RunnerError, UnparseableOutput, ValueError) as exc:
        log.error("response %s on %s failed mid-stream: %s", builder.response["id"], builder.response["model"], exc)
        yield _sse(builder.fail(str(exc)))
    finally:
        await events.aclose()


@post("/v1/responses", status_code=200)
async def create_response(request: Request) -> Any:
    body = await read_body(request, ResponsesBody)
    chat = chat_request(body, dict(request.headers))
    builder = ResponseBuilder(body)
    events = pipeline.run(request.app.state.services, chat)
    first = await anext(events)  # errors before any output become an HTTP error status
    if body.stream:
        return streamed(_stream(builder, first, events), SSE)
    builder.finish(await pipeline.drain(first, events, builder.feed))
    return Response(builder.response)


@get(["/v1/responses/{response_id:str}", "/v1/responses/{response_id:str}/input_items"], sync_to_thread=False)
def stored_response(response_id: str) -> None:
    raise NotFoundException(f"response {response_id!r} not found: {NOT_STORED}")


@delete("/v1/responses/{response_id:str}", status_code=200, sync_to_thread=False)
def delete_response(response_id: str) -> None:
    raise NotFoundException(f"response {response_id!r} not found: {NOT_STORED}")


ROUTES = [create_response, stored_response, delete_response]
