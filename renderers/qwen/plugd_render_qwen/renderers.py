"""The Qwen renderers by name, each with the detector that recognises its family's chat template."""

from __future__ import annotations

from functools import partial

from plugd.hookspecs import ModelFiles, Renderer
from plugd_render_qwen import detection, render_coder, render_qwen3, render_qwen35
from plugd_render_qwen.xml_calls import json_text, template_text


def _qwen35_detector(name: str):
    def detect(model: ModelFiles) -> bool:
        return detection.qwen35_variant(model) == name

    return detect


RENDERERS = [
    Renderer(name="qwen3", render=render_qwen3.render, detect=detection.is_qwen3),
    Renderer(name="qwen3-instruct", render=partial(render_qwen3.render, thinking=False),
             detect=detection.is_qwen3_instruct),
    Renderer(name="qwen3-coder", render=render_coder.render, detect=detection.is_qwen3_coder),
    Renderer(name="qwen3.5", render=partial(render_qwen35.render, thinks_by_default=True, value_text=template_text),
             detect=_qwen35_detector("qwen3.5")),
    Renderer(name="qwen3.5-nothink",
             render=partial(render_qwen35.render, thinks_by_default=False, value_text=template_text),
             detect=_qwen35_detector("qwen3.5-nothink")),
    Renderer(name="qwen3.6", render=partial(render_qwen35.render, thinks_by_default=True, value_text=json_text),
             detect=_qwen35_detector("qwen3.6")),
]
