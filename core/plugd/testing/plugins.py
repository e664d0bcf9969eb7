"""Plugin loading in tests: assertions for plugin distributions, and throwaway distributions to load."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from pathlib import Path
from types import ModuleType

from plugd import plugins


def assert_plugin_loads(name: str) -> plugins.PluginInfo:
    """The entry point `name` is installed, discovered in the group "plugd", and loads without error."""
    registry = plugins.load()
    found = {p.name: p for p in registry.plugins if not p.builtin}
    assert name in found, f"plugin {name!r} not discovered; found {sorted(found)}"
    info = found[name]
    assert info.status == "ok", f"plugin {name!r} is {info.status}: {info.error}"
    return info


def write_distribution(
    site: Path, name: str, modules: dict[str, str], entry_points: dict[str, str], version: str = "0.1"
) -> Path:
    """Write an installed-looking distribution into `site` (a directory to put on sys.path or PYTHONPATH).

    `modules` maps module names to source; `entry_points` maps names in the "plugd" group to modules.
    """
    site.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        (site / f"{module}.py").write_text(textwrap.dedent(source))
    dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = "".join(f"{ep} = {module}\n" for ep, module in entry_points.items())
    (dist_info / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\n{lines}")
    return site


class TemporaryPlugins:
    """Plugins that exist for one test, written as distributions into a throwaway site directory.

    While open, the site is on `sys.path`, so `plugd.plugins.load()` in the
    test process finds them; `env()` puts it on PYTHONPATH for the daemons
    and commands the test starts. A plugin given as a module object (rather
    than source) is found in this process only. The site may also be one that
    `pip install --target` filled. Closing forgets the modules imported from it.
    """

    def __init__(self, site: Path):
        self.site = Path(site).resolve()
        self.site.mkdir(parents=True, exist_ok=True)
        sys.path.insert(0, str(self.site))

    def add(self, name: str, plugin: str | ModuleType, version: str = "0.1") -> None:
        """Register entry point `name` in the group "plugd": module source text, or an imported module."""
        if isinstance(plugin, ModuleType):
            module, modules = plugin.__name__, {}
        else:
            module = "plugd_temporary_" + name.replace("-", "_")
            modules = {module: plugin}
        write_distribution(self.site, f"plugd-temporary-{name}", modules, {name: module}, version=version)
        importlib.invalidate_caches()

    def env(self) -> dict[str, str]:
        """Environment entries that let a subprocess find these plugins."""
        return {"PYTHONPATH": os.pathsep.join(filter(None, [str(self.site), os.environ.get("PYTHONPATH")]))}

    def close(self) -> None:
        if str(self.site) in sys.path:
            sys.path.remove(str(self.site))
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if file and Path(file).resolve().is_relative_to(self.site):
                del sys.modules[name]
        importlib.invalidate_caches()

    def __enter__(self) -> TemporaryPlugins:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
