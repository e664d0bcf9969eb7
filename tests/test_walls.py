"""The walls of the house: the daemon never imports MLX, the core imports no plugin, and plugins import only
plugd's public modules (docs/plugins.md, "What a plugin imports")."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import httpx

from plugd.testing.server import LiveServer

ROOT = Path(__file__).parents[1]
PLUGIN_FOLDERS = [ROOT / "plugins", ROOT / "renderers", ROOT / "architectures"]
PUBLIC = ("plugd.hookspecs", "plugd.types", "plugd.rendering", "plugd.parsing", "plugd.runner_api", "plugd.json_schema",
          "plugd.json_uniqueness", "plugd.schema_rewrites", "plugd.nn", "plugd.testing")

STARTED_APP = """
import sys, tempfile
from pathlib import Path
from litestar.testing import TestClient
from plugd import plugins
from plugd.server.app import create_app
from plugd.store.store import Store

app = create_app(Store(Path(tempfile.mkdtemp())), plugins.load())
with TestClient(app) as client:
    assert client.get("/api/tags").status_code == 200
    assert client.get("/api/ps").status_code == 200
    assert client.post("/api/chat", json={"model": "absent", "messages": []}).status_code == 404
    assert client.post("/v1/messages", json={"model": "absent", "max_tokens": 1,
                                              "messages": [{"role": "user", "content": "hi"}]}).status_code == 404
print(sorted(name for name in sys.modules if name.split(".")[0] in ("mlx", "torch", "xgrammar", "llguidance")))
"""


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, absolute imports only (relative ones stay inside its package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names if node.module == "plugd"}
    return names


def plugin_sources() -> list[Path]:
    return [path for folder in PLUGIN_FOLDERS for path in folder.glob("*/plugd_*/**/*.py")]


def test_the_daemon_never_imports_mlx_torch_or_a_grammar_engine():
    """In a fresh interpreter: every plugin loaded, the app started and serving requests of each dialect."""
    done = subprocess.run([sys.executable, "-c", STARTED_APP], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_serving_daemon_has_no_mlx_mapped_while_its_runner_does(tmp_path, tiny_qwen3):
    server = LiveServer(tmp_path / "models")
    try:
        (tmp_path / "Modelfile").write_text(f"FROM {tiny_qwen3}\n")
        server.cli("create", "m", "-f", str(tmp_path / "Modelfile"), check=True)
        reply = httpx.post(f"{server.url}/api/generate", timeout=120,
                           json={"model": "m", "prompt": "Hi", "stream": False, "options": {"num_predict": 2}})
        assert reply.status_code == 200

        def maps_mlx(pid: int) -> bool:
            return "/mlx/" in Path(f"/proc/{pid}/maps").read_text()

        (runner,) = server.runner_pids()
        assert maps_mlx(runner) and not maps_mlx(server.process.pid)
    finally:
        server.stop()


def test_the_core_imports_no_plugin():
    plugin_packages = {path.parent.name for path in plugin_sources() if path.name == "__init__.py"}
    assert {"plugd_qwen", "plugd_prefix_cache", "plugd_render_qwen"} <= plugin_packages
    offenders = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / "core" / "plugd").rglob("*.py")
        for name in imported_modules(path)
        if name.split(".")[0] in plugin_packages or name.startswith("plugd_")
    }
    assert offenders == set()


def test_plugins_import_only_public_modules():
    sources = plugin_sources()
    assert len(sources) > 40
    offenders = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in sources
        for name in imported_modules(path)
        if (name == "plugd" or name.startswith("plugd.")) and name != "plugd"
        and not any(name == public or name.startswith(public + ".") for public in PUBLIC)
    }
    assert offenders == set()


FAMILIES = re.compile(r"qwen|gemma|nemotron|(?<!o)llama(?!\.cpp)|mistral|deepseek|phi\d", re.IGNORECASE)


def spelled_names(path: Path) -> set[str]:
    """The identifiers and string constants of `path`'s code: its docstrings and comments left out."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names.add(node.value)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.name)
    return names


def test_no_code_of_the_core_names_a_model_family():
    """Family knowledge lives in the plugins' descriptors and modules; the test kit (plugd.testing, the registry's
    and hub's test servers), which builds checkpoints of each family for tests, is the exception."""
    core = ROOT / "core" / "plugd"
    offenders = {
        f"{path.relative_to(ROOT)}: {name!r}"
        for path in core.rglob("*.py")
        if "testing" not in path.relative_to(core).parts and path.stem != "testing"
        for name in spelled_names(path)
        if FAMILIES.search(name)
    }
    assert offenders == set()
