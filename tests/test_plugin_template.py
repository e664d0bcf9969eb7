"""plugin_template renders into a distribution that installs, is listed by `plugd plugins`, generates through a
live daemon, and passes its own tests.

The rendered plugin is installed with `pip install --target` into a temporary site directory put on
PYTHONPATH (and on sys.path while a test needs it), so nothing is left in the environment afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import copier
import ollama
import pytest

from plugd.hookspecs import PLUGIN_API_VERSION
from plugd.testing.architectures import tiny_checkpoint
from plugd.testing.plugins import TemporaryPlugins
from plugd.testing.server import LiveServer

TEMPLATE = Path(__file__).resolve().parents[1] / "plugin_template"
# Names with a hyphen and an underscore, to exercise every name the template derives from them.
ANSWERS = {"plugin_name": "plugd-tiny-llama", "model_type": "tiny_llama", "author_name": "A. Tester"}
ENTRY_POINT = "tiny-llama"


def render(destination: Path, **answers: str) -> Path:
    copier.run_copy(str(TEMPLATE), destination, data=answers, defaults=True, quiet=True)
    return destination


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    return render(tmp_path_factory.mktemp("rendered") / ANSWERS["plugin_name"], **ANSWERS)


@pytest.fixture(scope="module")
def site(rendered, tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(site), str(rendered)],
        check=True, capture_output=True, timeout=180,
    )
    return site


def with_site(site: Path, **env: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])), **env}


def test_renders_a_complete_distribution(rendered):
    files = {str(p.relative_to(rendered)) for p in rendered.rglob("*") if p.is_file()}
    assert {"pyproject.toml", "README.md", ".github/workflows/test.yml", "plugd_tiny_llama/__init__.py",
            "plugd_tiny_llama/tiny_llama.py", "tests/test_plugin.py", "tests/test_tiny_llama.py",
            "tests/test_serve.py"} <= files
    pyproject = (rendered / "pyproject.toml").read_text()
    assert f'{ENTRY_POINT} = "plugd_tiny_llama"' in pyproject and 'authors = [{ name = "A. Tester" }]' in pyproject
    assert '"architectures": ["TinyLlamaForCausalLM"]' in (rendered / "plugd_tiny_llama/tiny_llama.py").read_text()
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."], cwd=rendered,
                          capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize("answers", [{"plugin_name": "Plugd_Bad"}, {"plugin_name": "plugd-ok", "model_type": "my-model"}])
def test_refuses_names_that_cannot_work(answers, tmp_path):
    with pytest.raises(ValueError, match="lowercase"):
        render(tmp_path / "out", **answers)


def test_plugd_plugins_lists_the_installed_plugin(site):
    listed = subprocess.run([sys.executable, "-m", "plugd", "plugins", "--json"], env=with_site(site),
                            capture_output=True, text=True, check=True)
    plugin = {p["name"]: p for p in json.loads(listed.stdout)}[ENTRY_POINT]
    assert plugin["status"] == "ok" and plugin["version"] == "0.1.0"
    assert plugin["api"] == PLUGIN_API_VERSION
    assert plugin["provides"] == {"architectures": ["tiny_llama"]}


def test_tiny_checkpoint_of_its_model_type_generates_through_the_http_api(site, tmp_path):
    with TemporaryPlugins(site):
        checkpoint = tiny_checkpoint(tmp_path / "checkpoint", "tiny_llama", seed=3)
    assert json.loads((checkpoint / "config.json").read_text())["model_type"] == "tiny_llama"
    server = LiveServer(tmp_path / "models", env={**with_site(site), "PLUGD_PLUGINS": ENTRY_POINT})
    try:
        server.cli("create", "tiny", "--from", str(checkpoint), check=True)
        client = ollama.Client(host=server.url)
        reply = client.generate(model="tiny", prompt="Once upon a time", raw=True,
                                options={"temperature": 0, "num_predict": 12})
        assert reply.done and 0 < reply.eval_count <= 12 and reply.response
        assert client.show("tiny").details.family == "tiny_llama"
    finally:
        server.stop()


def test_the_rendered_plugins_own_tests_pass(rendered, site):
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=rendered,
                            env=with_site(site), capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "8 passed" in result.stdout
