"""The plugin host: entry points, PLUGD_PLUGINS, PLUGD_TRACE_PLUGINS, plugin API versions, and plugins that break
in every way we can think of."""

import json
import logging
import os
import subprocess
import sys

import httpx
import pytest

from plugd import plugins
from plugd.hookspecs import PLUGIN_API_VERSION, ModelFiles, RenderRequest
from plugd.testing.server import LiveServer
from plugd.types import Message

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
VISION_WITHOUT_MEDIA_TOKENS = """
from plugd.hookspecs import Architecture, hookimpl

@hookimpl
def plugd_architectures():
    return [Architecture("seeing", "nowhere", media_types=frozenset({"image/png"}))]
"""
BAD_SIGNATURE = """
from plugd.hookspecs import hookimpl

@hookimpl
def plugd_renderers(unexpected_argument):
    return []
"""
MISNAMED_HOOK = """
from plugd.hookspecs import Renderer, hookimpl

@hookimpl
def plugd_renderer():
    return [Renderer(name="never", render=lambda request: None)]

@hookimpl(optionalhook=True)
def plugd_hook_of_a_later_plugd():
    return []
"""
# Its hook raises, so a refusal that still called it would read "raised", not the version message.
FUTURE_API = """
from plugd.hookspecs import hookimpl

PLUGD_API = "2.0"

@hookimpl
def plugd_renderers():
    raise AssertionError("a plugin for another plugin API must not be called")
"""
CURRENT_API = """
from plugd.hookspecs import PLUGIN_API_VERSION, Renderer, hookimpl
from plugd.types import Prompt

PLUGD_API = PLUGIN_API_VERSION

@hookimpl
def plugd_renderers():
    return [Renderer(name="current", render=lambda request: Prompt(text="current"))]
"""
BROKEN = {"import-error": IMPORT_ERROR, "raising": RAISES, "wrong-type": WRONG_TYPE, "bad-signature": BAD_SIGNATURE,
          "misnamed-hook": MISNAMED_HOOK, "vision-without-media-tokens": VISION_WITHOUT_MEDIA_TOKENS}


@pytest.fixture
def site(plugd_temporary_plugins):
    for name, source in {"good": GOOD, **BROKEN}.items():
        plugd_temporary_plugins.add(name, source)
    return plugd_temporary_plugins.site


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
    assert listed["vision-without-media-tokens"]["status"] == "failed"
    assert "takes images but says no media_tokens" in listed["vision-without-media-tokens"]["error"]
    assert listed["bad-signature"]["status"] == "failed"
    assert "{'unexpected_argument'} are declared in the hookimpl" in listed["bad-signature"]["error"]
    # A misspelt hook would do nothing at all; an optional one is meant for a later plugd and is let be.
    assert listed["misnamed-hook"]["status"] == "failed"
    assert listed["misnamed-hook"]["error"].startswith("implements no hook of this plugd: plugd_renderer (plugd's hooks: ")
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


@pytest.mark.parametrize("declared", ["2.0", "0.9", f"{PLUGIN_API_VERSION.split('.')[0]}.999", "one", "1.0.0"])
def test_a_plugin_for_another_plugin_api_is_refused_naming_both_versions(declared):
    refusal = plugins.api_refusal(declared)
    assert refusal and repr(declared).strip("'") in refusal and PLUGIN_API_VERSION in refusal


@pytest.mark.parametrize("declared", [PLUGIN_API_VERSION, PLUGIN_API_VERSION.split(".")[0] + ".0"])
def test_a_plugin_for_this_api_or_an_earlier_minor_loads(declared):
    assert plugins.api_refusal(declared) is None


def test_incompatible_plugin_is_refused_at_load_and_the_daemon_keeps_serving(plugd_temporary_plugins, plugd_server_factory):
    plugd_temporary_plugins.add("future", FUTURE_API)
    plugd_temporary_plugins.add("current", CURRENT_API)
    server = plugd_server_factory(env={**plugd_temporary_plugins.env(), "PLUGD_TRACE_PLUGINS": "current"})
    assert httpx.get(server.url + "/api/tags").json() == {"models": []}
    refusal = f"built for plugd plugin API 2.0, but this plugd has plugin API {PLUGIN_API_VERSION}"
    log = server.log()
    assert f"plugin future disabled: {refusal}" in log
    assert "current: plugd_renderers() -> [Renderer current]" in log  # traced, as PLUGD_TRACE_PLUGINS asked
    listed = plugins_json(plugd_temporary_plugins.site)
    assert listed["future"]["status"] == "failed" and listed["future"]["error"].startswith(refusal)
    assert listed["future"]["api"] == "2.0" and listed["future"]["provides"] == {}
    assert listed["current"]["status"] == "ok" and listed["current"]["api"] == PLUGIN_API_VERSION
    assert listed["current"]["provides"] == {"renderers": ["current"]}


def trace_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == plugins.trace_log.name]


def test_trace_logs_hook_calls_and_calls_into_what_they_returned(site, caplog):
    with caplog.at_level(logging.INFO, logger=plugins.trace_log.name):
        shout = plugins.load(traced=["good"]).renderers()["shout"]
        prompt = shout.render(RenderRequest(model=ModelFiles(config={}), messages=[Message(role="user", content="hi")]))
    assert prompt.text == "HI"
    lines = trace_lines(caplog)
    assert lines[0].startswith("good: plugd_renderers() -> [Renderer shout] (")
    assert lines[1].startswith("good: Renderer shout.render(RenderRequest(model=ModelFiles(config={}")
    assert "-> Prompt(text='HI', media=[]) (" in lines[1]
    assert len(lines) == 2, "only the plugins named are traced"


def test_trace_all_includes_builtins_and_failures(site, caplog):
    with caplog.at_level(logging.INFO, logger=plugins.trace_log.name):
        plugins.load(traced=[plugins.TRACE_ALL])
    lines = trace_lines(caplog)
    assert any(line.startswith("jinja_renderer: plugd_renderers() -> [Renderer jinja]") for line in lines)
    assert any(line.startswith("raising: plugd_parsers() raised RuntimeError('parser table on fire')") for line in lines)


def test_without_tracing_descriptors_are_the_plugins_own(site, caplog):
    with caplog.at_level(logging.INFO, logger=plugins.trace_log.name):
        shout = plugins.load().renderers()["shout"]
    assert not hasattr(shout.render, "__wrapped__") and not trace_lines(caplog)
