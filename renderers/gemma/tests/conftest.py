"""The upstream Gemma chat templates, rendered the way transformers renders them, to compare our renderers with."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from plugd.builtins import jinja_renderer
from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.types import Message, Think, Tool

TEMPLATES = Path(__file__).resolve().parents[3] / "tests/reference/chat_templates"
BOS = {"bos_token": "<bos>"}


def template_text(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def model_files(template: str) -> ModelFiles:
    return ModelFiles(config={}, chat_template=template_text(template), tokenizer_config=BOS)


def render_upstream(template: str, messages: Sequence[Message], tools: Sequence[Tool] = (), think: Think = None) -> str:
    return jinja_renderer.render(RenderRequest(model_files(template), messages, tools, think)).text


@pytest.fixture(scope="session")
def upstream() -> Callable[..., str]:
    """render_upstream(template_name, messages, tools=(), think=None) -> the template's text."""
    return render_upstream


@pytest.fixture(scope="session")
def files() -> Callable[[str], ModelFiles]:
    """model_files(template_name) -> ModelFiles holding that reference template and a `<bos>` bos token."""
    return model_files
