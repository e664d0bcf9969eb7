"""Each upstream template is recognised by exactly its own renderer and parser, and nothing else is claimed."""

from pathlib import Path

import pytest

from plugd.hookspecs import ModelFiles
from plugd.testing.tokenizer import CHAT_TEMPLATE
from plugd_render_qwen.parsers import PARSERS
from plugd_render_qwen.renderers import RENDERERS

TEMPLATES = Path(__file__).resolve().parents[3] / "tests/reference/chat_templates"
EXPECTED = {  # template -> (renderer, parser)
    "qwen3.jinja": ("qwen3", "qwen3"),
    "qwen3-legacy-2025-05.jinja": ("qwen3", "qwen3"),
    "qwen3-instruct-2507.jinja": ("qwen3-instruct", "qwen3"),
    "qwen3-coder.jinja": ("qwen3-coder", "qwen3-coder"),
    "qwen3.5.jinja": ("qwen3.5", "qwen3.5"),
    "qwen3.5-nothink.jinja": ("qwen3.5-nothink", "qwen3.5"),
    "qwen3.6.jinja": ("qwen3.6", "qwen3.5"),
}
QWEN25_STYLE = (TEMPLATES / "qwen3-instruct-2507.jinja").read_text().replace(
    "{%- if messages[0].role == 'system' %}", "{{- 'You are Qwen, created by Alibaba Cloud.' }}{%- if false %}", 1)


def detected(template):
    model = ModelFiles(config={"model_type": "qwen3"}, chat_template=template)
    return [r.name for r in RENDERERS if r.detect(model)], [p.name for p in PARSERS if p.detect(model)]


@pytest.mark.parametrize("template", sorted(p.name for p in TEMPLATES.glob("*.jinja")))
def test_each_reference_template_is_claimed_by_its_own_family_only(template):
    renderer, parser = EXPECTED.get(template, (None, None))
    assert detected((TEMPLATES / template).read_text()) == ([renderer] if renderer else [], [parser] if parser else [])


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, QWEN25_STYLE, "", None])
def test_other_chatml_templates_are_not_claimed(template):
    assert detected(template) == ([], [])
