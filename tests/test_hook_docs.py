"""docs/plugins.md documents every hook and every object the hooks exchange with its exact signature, read off
plugd.hookspecs, and the plugin API version the core declares."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import attrs
import pytest

from plugd import hookspecs

DOCS = Path(__file__).parents[1] / "docs"
DOC = (DOCS / "plugins.md").read_text()
DOC_LINES = set(DOC.splitlines())
EXCHANGED = sorted(name for name in hookspecs.__all__ if attrs.has(getattr(hookspecs, name)))


def documented_hooks() -> list[str]:
    return re.findall(r"^### (plugd_\w+)\(", DOC, flags=re.M)


def default_text(value: Any) -> str:
    if isinstance(value, frozenset | set):  # sorted, so that the text does not follow hash order
        return f"{type(value).__name__}({{{', '.join(map(repr, sorted(value)))}}})"
    if callable(value):  # a default function, by the name hookspecs exports it under
        return value.__name__
    return repr(value)


def class_signature(cls: type) -> str:
    """`Name(field: type, field: type = default)` with the annotations as hookspecs.py writes them."""
    parameters = []
    for field in attrs.fields(cls):
        text = f"{field.name}: {field.type}"
        if field.default is not attrs.NOTHING:
            default = field.default.factory() if isinstance(field.default, attrs.Factory) else field.default
            text += f" = {default_text(default)}"
        parameters.append(text)
    return f"{cls.__name__}({', '.join(parameters)})"


def section(hook: str) -> str:
    return DOC.split(f"### {hook}(")[1].split("\n## ")[0].split("\n### ")[0]


def test_every_hookspec_is_documented():
    specs = [n for n, f in vars(hookspecs).items() if hasattr(f, "plugd_spec")]
    assert sorted(specs) == sorted(hookspecs.HOOKS)
    assert sorted(documented_hooks()) == sorted(specs)


@pytest.mark.parametrize("hook", sorted(hookspecs.HOOKS))
def test_hook_section_gives_the_hook_and_its_descriptor_exact_signatures(hook):
    function = getattr(hookspecs, hook)
    assert f"### {hook}{inspect.signature(function)}".replace("'", "") in DOC_LINES
    assert class_signature(hookspecs.HOOKS[hook]) in section(hook).splitlines()


@pytest.mark.parametrize("name", EXCHANGED)
def test_every_exchanged_object_is_documented_with_its_exact_signature(name):
    assert class_signature(getattr(hookspecs, name)) in DOC_LINES


@pytest.mark.parametrize("method", ["feed", "finish"])
def test_stream_parser_methods_are_documented(method):
    signature = str(inspect.signature(getattr(hookspecs.StreamParser, method))).replace("'", "")
    assert f"def {method}{signature}" in DOC_LINES


def test_the_plugin_api_version_is_documented():
    assert f'PLUGD_API = "{hookspecs.PLUGIN_API_VERSION}"' in DOC_LINES
    assert f'now `"{hookspecs.PLUGIN_API_VERSION}"`' in " ".join(DOC.split())


def test_docs_link_to_pages_that_exist():
    for page in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([\w./-]+\.md)\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"
