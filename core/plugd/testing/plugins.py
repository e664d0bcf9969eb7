"""Plugin loading in tests: assertions for plugin distributions, and throwaway distributions to load."""

from __future__ import annotations

import textwrap
from pathlib import Path

from plugd import plugins


def assert_plugin_loads(name: str) -> plugins.PluginInfo:
    """The entry point `name` is installed, discovered in the group "plugd", and loads without error."""
    registry = plugins.load()
    found = {p.name: p for p in registry.plugins if not p.builtin}
    assert name in found, f"plugin {name!r} not discovered; found {sorted(found)}"
    info = found[name]
    assert info.status == "ok", f"plugin {name!r} is {info.status}: {info.error}"
    return info


def write_distribution(site: Path, name: str, modules: dict[str, str], entry_points: dict[str, str]) -> Path:
    """Write an installed-looking distribution into `site` (a directory to put on sys.path or PYTHONPATH).

    `modules` maps module names to source; `entry_points` maps names in the "plugd" group to modules.
    """
    site.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        (site / f"{module}.py").write_text(textwrap.dedent(source))
    dist_info = site / f"{name.replace('-', '_')}-0.1.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    lines = "".join(f"{ep} = {module}\n" for ep, module in entry_points.items())
    (dist_info / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\n{lines}")
    return site
