"""The pipeline's events written as OpenAI objects: chat completions, text completions, their chunks and usage.

A writer is made per response: it carries the response's id and, while
streaming, what the closing chunks need (tool calls seen, text offsets).
"""

from __future__ import annotations

import json
import secrets
import time
from abc import ABC, abstractmethod
from itertools import accumulate
from typing import Any

from plugd.chat.pipeline import Delta, Final
from plugd.types import ToolCall

SYSTEM_FINGERPRINT = "fp_plugd"


def _usage(final: Final) -> dict[str, Any]:
    return {
        "prompt_tokens": final.prompt_tokens,
        "completion_tokens": final.eval_count,
        "total_tokens": final.prompt_tokens + final.eval_count,
        "prompt_tokens_details": {"cached_tokens": final.cached_tokens},
    }


def _finish_reason(final: Final) -> str:
    return "length" if final.done_reason == "length" else "stop"


def _token(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def _chat_token(entry: dict[str, Any]) -> dict[str, Any]:
    top = [_token(t["token"], t["logprob"]) for t in entry["top_logprobs"]]
    return _token(entry["token"], entry["logprob"]) | {"top_logprobs": top}


def _chat_logprobs(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """OpenAI's chat logprobs object for the pipeline's per-token entries."""
    return {"content": [_chat_token(e) for e in entries]}


def _text_logprobs(entries: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    """The legacy completions logprobs object; `offset` is where the first token starts in the generated text."""
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": list(accumulate((len(e["token"]) for e in entries[:-1]), initial=offset)) if entries else [],
    }


def _tool_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}


class Writer(ABC):
    """What both endpoints' objects share: id, created, model, fingerprint, usage and the closing chunks."""

    id_prefix = ""
    whole_object = ""
    chunk_object = ""

    def __init__(self, model: str, include_usage: bool):
        self.id = f"{self.id_prefix}-{secrets.token_hex(12)}"
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": SYSTEM_FINGERPRINT, "choices": choices}

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        return self._envelope(self.chunk_object, [{"index": 0} | choice])

    def closing(self, final: Final) -> list[dict[str, Any]]:
        """The chunk with the finish reason and, when asked for, the usage chunk (its choices empty)."""
        chunks = [self._chunk(self._finish_choice(final))]
        if self.include_usage:
            chunks.append(self._envelope(self.chunk_object, []) | {"usage": _usage(final)})
        return chunks

    def whole(self, total: Delta, final: Final) -> dict[str, Any]:
        return self._envelope(self.whole_object, [{"index": 0} | self._whole_choice(total, final)]) | {
            "usage": _usage(final)}

    def opening(self) -> list[dict[str, Any]]:
        return []

    @abstractmethod
    def chunks(self, delta: Delta) -> list[dict[str, Any]]:
        """The chunks that stream one delta (none when it carries nothing to show)."""

    @abstractmethod
    def _finish_choice(self, final: Final) -> dict[str, Any]:
        """The last streamed choice: nothing new, and the finish reason."""

    @abstractmethod
    def _whole_choice(self, total: Delta, final: Final) -> dict[str, Any]:
        """The one choice of a non-streamed response."""


class ChatWriter(Writer):
    """/v1/chat/completions: thinking as `reasoning_content`, each tool call in a delta of its own with its index."""

    id_prefix = "chatcmpl"
    whole_object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, model: str, include_usage: bool):
        super().__init__(model, include_usage)
        self.tool_calls_sent = 0

    def opening(self) -> list[dict[str, Any]]:
        return [self._chunk({"delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None})]

    def chunks(self, delta: Delta) -> list[dict[str, Any]]:
        text: dict[str, Any] = {}
        if delta.thinking:
            text["reasoning_content"] = delta.thinking
        if delta.content:
            text["content"] = delta.content
        out = []
        if text or delta.logprobs:
            logprobs = _chat_logprobs(delta.logprobs) if delta.logprobs else None
            out.append(self._chunk({"delta": text, "logprobs": logprobs, "finish_reason": None}))
        for call in delta.tool_calls:
            call_delta = {"tool_calls": [{"index": self.tool_calls_sent} | _tool_call(call)]}
            out.append(self._chunk({"delta": call_delta, "logprobs": None, "finish_reason": None}))
            self.tool_calls_sent += 1
        return out

    def _finish_choice(self, final: Final) -> dict[str, Any]:
        reason = "tool_calls" if self.tool_calls_sent else _finish_reason(final)
        return {"delta": {}, "logprobs": None, "finish_reason": reason}

    def _whole_choice(self, total: Delta, final: Final) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": total.content or (None if total.tool_calls else "")}
        if total.thinking:
            message["reasoning_content"] = total.thinking
        if total.tool_calls:
            message["tool_calls"] = [_tool_call(c) for c in total.tool_calls]
        return {"message": message, "logprobs": _chat_logprobs(total.logprobs) if total.logprobs else None,
                "finish_reason": "tool_calls" if total.tool_calls else _finish_reason(final)}


class TextWriter(Writer):
    """/v1/completions: the generated text, with the legacy logprobs object."""

    id_prefix = "cmpl"
    whole_object = "text_completion"
    chunk_object = "text_completion"

    def __init__(self, model: str, include_usage: bool):
        super().__init__(model, include_usage)
        self.text_sent = 0

    def chunks(self, delta: Delta) -> list[dict[str, Any]]:
        logprobs = _text_logprobs(delta.logprobs, self.text_sent) if delta.logprobs else None
        self.text_sent += sum(len(e["token"]) for e in delta.logprobs)
        if not (delta.content or logprobs):
            return []
        return [self._chunk({"text": delta.content, "logprobs": logprobs, "finish_reason": None})]

    def _finish_choice(self, final: Final) -> dict[str, Any]:
        return {"text": "", "logprobs": None, "finish_reason": _finish_reason(final)}

    def _whole_choice(self, total: Delta, final: Final) -> dict[str, Any]:
        return {"text": total.content, "logprobs": _text_logprobs(total.logprobs, 0) if total.logprobs else None,
                "finish_reason": _finish_reason(final)}
