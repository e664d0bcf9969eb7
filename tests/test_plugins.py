"""The plugin host: entry points, PLUGD_PLUGINS, and plugins that break in every way we can think of."""

import json
import os
import subprocess
import sys

import httpx
import pytest

from plugd.testing.plugins import write_distribution
from plugd.testing.server import LiveServer

GOOD = """
from plugd.hookspecs import Renderer, hookimpl
from plugd.types import Prompt

@hookimpl
def plugd_renderers():
    return [Renderer(name="shout", render=lambda request: Prompt(text=request.messages[-1].content.upper()))]
"""
IMPORT_ERROR = "import does_not_exist_anywhere\n"
RAISES = """
from plugd.hookspecs import hookimpl

@hookimpl
def plugd_parsers():
    raise RuntimeError("parser table on fire")
"""
WRONG_TYPE = """
from plugd.hookspecs import hookimpl

@hookimpl
def plugd_architectures():
    return ["not an Architecture"]
"""
BAD_SIGNATURE = """
from plugd.hookspecs import hookimpl

@hookimpl
def plugd_renderers(unexpected_argument):
    return []
"""


@pytest.fixture
def site(tmp_path):
    return write_distribution(
        tmp_path / "site",
        "plugd-test-plugins",
        modules={"good_plug": GOOD, "import_error_plug": IMPORT_ERROR, "raising_plug": RAISES,
                 "wrong_type_plug": WRONG_TYPE, "bad_signature_plug": BAD_SIGNATURE},
        entry_points={"good": "good_plug", "import-error": "import_error_plug", "raising": "raising_plug",
                      "wrong-type": "wrong_type_plug", "bad-signature": "bad_signature_plug"},
    )


def plugins_json(site, **env):
    result = subprocess.run(
        [sys.executable, "-m", "plugd", "plugins", "--json"],
        env={**os.environ, "PYTHONPATH": str(site), **env}, capture_output=True, text=True, check=True,
    )
    return {p["name"]: p for p in json.loads(result.stdout)}


def test_broken_plugins_are_listed_as_failed_and_the_rest_load(site):
    listed = plugins_json(site)
    assert listed["good"]["status"] == "ok"
    assert listed["good"]["provides"] == {"renderers": ["shout"]}
    assert listed["import-error"]["status"] == "failed"
    assert "does_not_exist_anywhere" in listed["import-error"]["error"]
    assert listed["raising"]["status"] == "failed"
    assert "parser table on fire" in listed["raising"]["error"]
    assert listed["wrong-type"]["status"] == "failed"
    assert "expected Architecture" in listed["wrong-type"]["error"]
    assert listed["bad-signature"]["status"] == "failed"
    assert listed["system_memory"]["builtin"] and listed["system_memory"]["status"] == "ok"
    # A failed plugin contributes nothing, even what it registered before failing.
    assert all(not p["provides"] for p in listed.values() if p["status"] == "failed")


def test_plugd_plugins_filter(site):
    listed = plugins_json(site, PLUGD_PLUGINS="good")
    assert listed["good"]["status"] == "ok"
    assert listed["raising"]["status"] == "disabled"
    assert listed["jinja_renderer"]["status"] == "ok"  # built-ins always load

    none = plugins_json(site, PLUGD_PLUGINS="")
    assert {p["status"] for p in none.values() if not p["builtin"]} == {"disabled"}


def test_plugins_table(site):
    result = subprocess.run(
        [sys.executable, "-m", "plugd", "plugins"], env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True, text=True, check=True,
    )
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["NAME", "VERSION", "HOOKS", "STATUS"]
    good = next(r for r in rows if r.startswith("good "))
    assert "renderers" in good and "ok" in good
    assert "failed: import failed" in next(r for r in rows if r.startswith("import-error "))


def test_serve_keeps_running_with_broken_plugins(site, tmp_path):
    server = LiveServer(tmp_path / "models", env={"PYTHONPATH": str(site)})
    try:
        assert httpx.get(server.url + "/api/tags").json() == {"models": []}
        log = server.log()
        assert "plugin raising disabled" in log and "plugin import-error disabled" in log
    finally:
        server.stop()
