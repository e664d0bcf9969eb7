"""The Qwen output parsers, one per call syntax and thinking habit."""

from __future__ import annotations

from collections.abc import Sequence

from plugd.hookspecs import Parser
from plugd.types import Tool
from plugd_render_qwen import detection, hermes, xml_calls
from plugd_render_qwen.stream import CallReader, QwenStreamParser, answer_after


def _factory(read_call: CallReader, thinking: bool):
    def create(tools: Sequence[Tool], prompt: str) -> QwenStreamParser:
        return QwenStreamParser(tools, prompt, read_call=read_call, thinking=thinking)

    return create


PARSERS = [
    Parser(name="qwen3", create=_factory(hermes.read_call, thinking=True), detect=detection.is_qwen3_family,
           answer_after=answer_after, forced_call=hermes.forced_call, aliases=("qwen3-thinking",)),
    # XML calls carry no JSON a grammar engine could enforce: these parsers cannot force a call.
    Parser(name="qwen3-coder", create=_factory(xml_calls.read_call, thinking=False), detect=detection.is_qwen3_coder),
    Parser(name="qwen3.5", create=_factory(xml_calls.read_call, thinking=True), detect=detection.is_qwen35_family,
           answer_after=answer_after, aliases=("ornith",)),
]
