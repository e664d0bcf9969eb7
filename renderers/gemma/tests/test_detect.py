"""Each reference template is recognised by exactly its own renderer, through the plugin's entry point."""

from __future__ import annotations

import pytest

from plugd import plugins
from plugd.hookspecs import ModelFiles
from plugd_render_gemma import GEMMA4_TEMPLATES

OURS = ["gemma3", *GEMMA4_TEMPLATES]
EXPECTED = {
    "gemma3": {"gemma3"},
    "gemma4": {"gemma4"},
    "gemma4-e2b": {"gemma4-e2b"},
    "gemma4-31b-2026-04": {"gemma4-2026-04"},
    "gemma4-e2b-2026-04": {"gemma4-e2b-2026-04"},
}
CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def registry() -> plugins.Registry:
    return plugins.load()


@pytest.mark.parametrize("template", ["gemma3", "gemma4", "gemma4-e2b", "gemma4-31b-2026-04", "gemma4-e2b-2026-04",
                                      "qwen3", "qwen3-coder", "qwen3.5", "nemotron-3-nano", "nemotron-nano-v2"])
def test_each_template_is_claimed_by_its_own_renderer(template, registry, files):
    renderers = registry.renderers()
    claimed = {name for name in OURS if renderers[name].detect(files(template))}
    assert claimed == EXPECTED.get(template, set())
    parser_claims = registry.parsers()["gemma4"].detect(files(template))
    assert parser_claims == template.startswith("gemma4")


def test_generic_chatml_and_missing_templates_are_not_claimed(registry):
    for template in (CHATML, None, ""):
        model = ModelFiles(config={"model_type": "gemma3"}, chat_template=template)
        assert not any(registry.renderers()[name].detect(model) for name in OURS)
        assert not registry.parsers()["gemma4"].detect(model)
