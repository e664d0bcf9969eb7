"""OpenAI's Responses API (/v1/responses), stateless: translated onto the shared chat pipeline.

plugd stores no responses. A request must carry its whole conversation as
`input`; `previous_response_id`, `conversation` and `background` are refused,
and every response says `"store": false` whatever the request asked, so that a
client knows it cannot fetch the response back later.

Input items are read in openai_responses_input, tools in openai_responses_tools. Output side:
thinking, text and tool calls become reasoning, message and function_call (or custom_tool_call) items
in the order the model produced them.
"""

from __future__ import annotations

import copy
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from attrs import define
from litestar import Request, delete, get, post
from litestar.exceptions import NotFoundException

from plugd.chat import pipeline
from plugd.chat.pipeline import ChatRequest, Delta, Final, Prefill, Services
from plugd.server.bodies import BadRequest, json_body
from plugd.server.openai_responses_input import NOT_STORED, input_messages
from plugd.server.openai_responses_tools import ResponsesTools, tool_choice
from plugd.server.sse import sse_event
from plugd.server.streaming import StreamFormat, respond
from plugd.types import Think, ToolCall

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


def chat_request(body: ResponsesBody, tools: ResponsesTools, headers: dict[str, str]) -> ChatRequest:
    """The pipeline request for a Responses body; a 400 for anything plugd cannot serve as asked."""
    _refuse_unservable(body)
    return ChatRequest(
        model=body.model,
        messages=input_messages(body.input, body.instructions),
        tools=tools.tools,
        tool_choice=tool_choice(body.tool_choice),
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


_CALL_KINDS = {  # call item type -> the field its text is in, its id prefix, and the stream events of that text
    "function_call": ("arguments", "fc", "response.function_call_arguments"),
    "custom_tool_call": ("input", "ctc", "response.custom_tool_call_input"),
}


class ResponseBuilder:
    """The response object as it grows from the pipeline's events, and the stream events that announce each step.

    Non-streaming requests use the same builder and keep only `response`.
    """

    def __init__(self, body: ResponsesBody, tools: ResponsesTools):
        self._tools = tools
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
            events += self._close("completed") + self._call(call)
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

    def fail(self, message: str, code: str = "server_error") -> list[dict[str, Any]]:
        events = self._close("incomplete")
        self.response |= {"status": "failed", "error": {"code": code, "message": message}}
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

    def _call(self, call: ToolCall) -> list[dict[str, Any]]:
        """A function_call item with its arguments events, or a custom_tool_call item with its input events."""
        item = self._tools.call_item(call)
        text_field, prefix, events = _CALL_KINDS[item["type"]]
        item = {"id": _new_id(prefix)} | item | {"status": "completed"}
        self._output.append(item)
        index = len(self._output) - 1
        where = {"item_id": item["id"], "output_index": index}
        named = {"name": call.name} if item["type"] == "function_call" else {}
        return [self._event("response.output_item.added", output_index=index,
                            item=item | {text_field: "", "status": "in_progress"}),
                self._event(f"{events}.delta", **where, delta=item[text_field]),
                self._event(f"{events}.done", **where, **named, **{text_field: item[text_field]}),
                self._event("response.output_item.done", output_index=index, item=dict(item))]


def _sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(sse_event(event, event=event["type"]) for event in events)


class ResponseStream(StreamFormat):
    """response.created and response.in_progress as the prefill starts, the output's events, then the final one.

    A failure once the stream has begun is its response.failed event: a prompt over the context with the code
    context_length_exceeded and the Responses API's words for it (Codex takes that code as final, where it resends
    a server_error)."""

    dialect = "openai"

    def __init__(self, builder: ResponseBuilder):
        super().__init__("/v1/responses")
        self.builder = builder

    def opening(self, first: Prefill | Delta | Final) -> bytes:
        return _sse(self.builder.start())

    def delta(self, delta: Delta) -> bytes:
        return _sse(self.builder.feed(delta))

    def closing(self, final: Final) -> bytes:
        return _sse(self.builder.finish(final))

    def failure(self, status: int, body: dict[str, Any], exc: Exception) -> bytes:
        error = body["error"]
        return _sse(self.builder.fail(error["message"], error["code"] or "server_error"))


@post("/v1/responses", status_code=200, dependencies=json_body(ResponsesBody))
async def create_response(request: Request, services: Services, payload: ResponsesBody) -> Any:
    tools = ResponsesTools(payload.tools)
    chat = chat_request(payload, tools, dict(request.headers))
    builder = ResponseBuilder(payload, tools)

    async def whole(first: Delta | Final, events: AsyncIterator[Delta | Final]) -> dict[str, Any]:
        builder.finish(await pipeline.drain(first, events, builder.feed))
        return builder.response

    return await respond(request, services, chat, ResponseStream(builder) if payload.stream else None, whole)


@get(["/v1/responses/{response_id:str}", "/v1/responses/{response_id:str}/input_items"], sync_to_thread=False)
def stored_response(response_id: str) -> None:
    raise NotFoundException(f"response {response_id!r} not found: {NOT_STORED}")


@delete("/v1/responses/{response_id:str}", status_code=200, sync_to_thread=False)
def delete_response(response_id: str) -> None:
    raise NotFoundException(f"response {response_id!r} not found: {NOT_STORED}")


ROUTES = [create_response, stored_response, delete_response]
