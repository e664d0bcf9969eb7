"""The pipeline's events written as an Anthropic message: content blocks, stop reason, usage, and the SSE stream."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

from attrs import define, field

from plugd.chat.pipeline import Delta, Final, Prefill, drain
from plugd.server.sse import sse_event
from plugd.server.streaming import StreamFormat
from plugd.types import ToolCall

Event = tuple[str, dict[str, Any]]  # an SSE event name and its data


@define
class ContentBlocks:
    """The response's content blocks, built delta by delta, with the stream events that build them on the client.

    Consecutive thinking (or text) pieces extend one block; a change of kind, or a
    tool call, closes it and opens the next, so the index grows with each block.
    """

    hide_thinking: bool = False
    content: list[dict[str, Any]] = field(factory=list)
    _open: bool = False  # whether content[-1] may still grow

    def add(self, delta: Delta) -> list[Event]:
        events = []
        if delta.thinking:
            events += self._extend("thinking", delta.thinking)
        if delta.content:
            events += self._extend("text", delta.content)
        for call in delta.tool_calls:
            events += self._tool_use(call)
        return events

    def close(self) -> list[Event]:
        if not self._open:
            return []
        self._open = False
        index = len(self.content) - 1
        events = []
        if self.content[index]["type"] == "thinking":
            # Anthropic signs thinking so that it can verify it when sent back; a local model has nothing to verify.
            events.append(_block_delta(index, {"type": "signature_delta", "signature": ""}))
        return events + [("content_block_stop", {"type": "content_block_stop", "index": index})]

    def has_tool_use(self) -> bool:
        return any(block["type"] == "tool_use" for block in self.content)

    def _extend(self, kind: str, text: str) -> list[Event]:
        """Append text to the open block of `kind` (the block's text lives under the key `kind` too)."""
        events = []
        if not (self._open and self.content[-1]["type"] == kind):
            events += self.close()
            events.append(self._start({"type": kind, kind: ""} | ({"signature": ""} if kind == "thinking" else {})))
            self._open = True
        if kind == "thinking" and self.hide_thinking:
            return events
        self.content[-1][kind] += text
        return events + [_block_delta(len(self.content) - 1, {"type": f"{kind}_delta", kind: text})]

    def _tool_use(self, call: ToolCall) -> list[Event]:
        events = self.close()
        events.append(self._start({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}))
        index = len(self.content) - 1
        events.append(_block_delta(index, {"type": "input_json_delta", "partial_json": json.dumps(call.arguments)}))
        return events + [("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _start(self, block: dict[str, Any]) -> Event:
        self.content.append(block)
        shown = block | {"input": {}} if block["type"] == "tool_use" else dict(block)
        return "content_block_start", {"type": "content_block_start", "index": len(self.content) - 1, "content_block": shown}


def _block_delta(index: int, delta: dict[str, Any]) -> Event:
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}


def message_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


def usage(counts: Prefill | Final | None) -> dict[str, int]:
    """Anthropic counts input tokens read from its cache apart from those it evaluated; plugd's prefix reuse alike.

    A stream's message_start has the prompt's counts (from the prefill's start), its message_delta all of them."""
    return {
        "input_tokens": counts.prompt_tokens - counts.cached_tokens if counts else 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": counts.cached_tokens if counts else 0,
        "output_tokens": counts.eval_count if isinstance(counts, Final) else 0,
    }


def stop_reason(final: Final, blocks: ContentBlocks) -> str:
    if final.done_reason == "length":
        return "model_context_window_exceeded" if final.context_full else "max_tokens"
    if final.stop_sequence is not None:
        return "stop_sequence"
    return "tool_use" if blocks.has_tool_use() else "end_turn"


def message(message_id: str, model: str, content: list[dict[str, Any]], final: Final | None,
            reason: str | None) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": final.stop_sequence if final else None, "usage": usage(final)}


async def whole_message(model: str, first: Delta | Final, events: AsyncIterator[Delta | Final],
                        hide_thinking: bool) -> dict[str, Any]:
    """The complete message; the pipeline is closed (and the runner released) before it returns."""
    blocks = ContentBlocks(hide_thinking=hide_thinking)
    final = await drain(first, events, blocks.add)
    blocks.close()
    return message(message_id(), model, blocks.content, final, stop_reason(final, blocks))


class MessageStream(StreamFormat):
    """message_start (with the prompt's usage when the first event is the prefill's start), a ping for each
    prefill event (the first follows message_start, as Anthropic's does; the others keep the client's idle timeout
    from firing during a long prefill), each block's start/deltas/stop, message_delta with the stop reason and
    usage, message_stop; a failure once the stream has begun is an error event."""

    dialect = "anthropic"

    def __init__(self, model: str, hide_thinking: bool):
        super().__init__("/v1/messages")
        self.model = model
        self.blocks = ContentBlocks(hide_thinking=hide_thinking)

    def opening(self, first: Prefill | Delta | Final) -> bytes:
        start = message(message_id(), self.model, [], None, None) | {
            "usage": usage(first if isinstance(first, Prefill) else None)}
        return sse_event({"type": "message_start", "message": start}, event="message_start")

    def keep_alive(self, prefill: Prefill) -> bytes:
        return sse_event({"type": "ping"}, event="ping")

    def delta(self, delta: Delta) -> bytes:
        return _events(self.blocks.add(delta))

    def closing(self, final: Final) -> bytes:
        delta = {"stop_reason": stop_reason(final, self.blocks), "stop_sequence": final.stop_sequence}
        return _events(self.blocks.close()) + _events([
            ("message_delta", {"type": "message_delta", "delta": delta, "usage": usage(final)}),
            ("message_stop", {"type": "message_stop"})])

    def failure(self, status: int, body: dict[str, Any], exc: Exception) -> bytes:
        return sse_event(body, event="error")


def _events(events: list[Event]) -> bytes:
    return b"".join(sse_event(data, event=name) for name, data in events)
