"""docs/plugins.md documents every hook, with its signature and its descriptor's fields."""

import inspect
import re
from pathlib import Path

import attrs
import pytest

from plugd import hookspecs

DOC = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()


def documented_hooks() -> list[str]:
    return re.findall(r"^### (plugd_\w+)\(", DOC, flags=re.M)


def test_every_hookspec_is_listed_in_hooks_table():
    specs = [n for n, f in vars(hookspecs).items() if hasattr(f, "plugd_spec")]
    assert sorted(specs) == sorted(hookspecs.HOOKS)
    assert sorted(documented_hooks()) == sorted(specs)


@pytest.mark.parametrize("hook", sorted(hookspecs.HOOKS))
def test_hook_section_has_signature_and_fields(hook):
    function = getattr(hookspecs, hook)
    descriptor = hookspecs.HOOKS[hook]
    signature = f"### {hook}{inspect.signature(function)}".replace("'", "")
    assert signature in DOC.splitlines()
    section = DOC.split(f"### {hook}(")[1].split("\n### ")[0]
    assert f"`{descriptor.__name__}(" in section
    for field in attrs.fields(descriptor):
        assert field.name in section, f"{descriptor.__name__}.{field.name} is not documented under {hook}"
