"""The plugin manager: built-in plugins, entry points in the group "plugd", and the registry of what they give.

`PLUGD_PLUGINS` restricts which entry-point plugins load: unset loads all,
an empty value loads none, otherwise a comma-separated list of entry-point or
distribution names. Built-in plugins always load. A plugin that fails to
import, or whose hook raises or returns something that is not its hook's
descriptor, is reported (a log line and its listing status) and contributes
nothing; the daemon goes on without it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy
from attrs import define, field

from plugd import __version__, hookspecs
from plugd.builtins import BUILTIN_MODULES

log = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "plugd"


@define
class PluginInfo:
    name: str
    version: str
    hooks: list[str] = field(factory=list)
    status: str = "ok"  # ok | failed | disabled
    error: str | None = None
    builtin: bool = False
    provides: dict[str, list[str]] = field(factory=dict)


@define(eq=False)
class Registry:
    """Every descriptor the loaded plugins returned, by hook, in priority order (third-party before built-in)."""

    plugins: list[PluginInfo]
    items: dict[str, list[Any]]

    def named(self, hook: str) -> dict[str, Any]:
        """Descriptors of `hook` by name (by model_type for architectures); the first of a name wins."""
        out: dict[str, Any] = {}
        for item in self.items.get(hook, []):
            out.setdefault(_descriptor_name(item), item)
        return out

    def architectures(self) -> dict[str, hookspecs.Architecture]:
        return self.named("plugd_architectures")

    def renderers(self) -> dict[str, hookspecs.Renderer]:
        return self.named("plugd_renderers")

    def parsers(self) -> dict[str, hookspecs.Parser]:
        return self.named("plugd_parsers")


def _descriptor_name(item: Any) -> str:
    return getattr(item, "name", None) or item.model_type


def _enabled_names() -> set[str] | None:
    value = os.environ.get("PLUGD_PLUGINS")
    if value is None:
        return None
    return {n.strip() for n in value.split(",") if n.strip()}


def _entry_points() -> Iterable[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def load() -> Registry:
    """Load built-in and entry-point plugins and collect what their hooks return."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    infos: list[PluginInfo] = []
    modules: list[tuple[PluginInfo, ModuleType]] = []

    for module in BUILTIN_MODULES:
        info = PluginInfo(name=module.__name__.rsplit(".", 1)[-1], version=__version__, builtin=True)
        infos.append(info)
        modules.append((info, module))

    enabled = _enabled_names()
    for ep in _entry_points():
        dist = ep.dist
        info = PluginInfo(name=ep.name, version=dist.version if dist else "?")
        infos.append(info)
        if enabled is not None and not ({ep.name, dist.name if dist else ""} & enabled):
            info.status = "disabled"
            continue
        try:
            module = ep.load()
        except Exception as exc:  # a plugin's import can fail in any way
            _fail(info, f"import failed: {exc!r}")
            continue
        modules.append((info, module))

    for info, module in modules:
        try:
            pm.register(module, name=f"{'builtin' if info.builtin else 'plugin'}:{info.name}")
        except Exception as exc:  # pluggy validation of hook names and signatures
            _fail(info, f"registration failed: {exc}")
            continue
        info.hooks = sorted(impl_name for impl_name in dir(module) if impl_name in hookspecs.HOOKS)

    items = _collect(pm, {id(m): info for info, m in modules})
    for info in infos:
        if info.status == "failed":
            for hook in items:
                items[hook] = [(owner, d) for owner, d in items[hook] if owner is not info]
    registry = Registry(plugins=infos, items={h: [d for _, d in pairs] for h, pairs in items.items()})
    for info in infos:
        info.provides = {}
        for hook, pairs in items.items():
            names = [_descriptor_name(d) for owner, d in pairs if owner is info]
            if names:
                info.provides[hook.removeprefix("plugd_")] = names
    return registry


def _collect(pm: pluggy.PluginManager, info_of: dict[int, PluginInfo]) -> dict[str, list[tuple[PluginInfo, Any]]]:
    """Call each implementation of each hook on its own, so one raising plugin cannot hide the others."""
    items: dict[str, list[tuple[PluginInfo, Any]]] = {}
    for hook, descriptor in hookspecs.HOOKS.items():
        pairs = items.setdefault(hook, [])
        # pluggy lists implementations oldest first; later registrations (third-party) take priority.
        for impl in reversed(getattr(pm.hook, hook).get_hookimpls()):
            info = info_of[id(impl.plugin)]
            if info.status == "failed":
                continue
            try:
                result = list(impl.function() or ())
                bad = [r for r in result if not isinstance(r, descriptor)]
                if bad:
                    raise TypeError(f"returned {bad[0]!r}, expected {descriptor.__name__} instances")
            except Exception as exc:  # a plugin's hook can fail in any way
                _fail(info, f"{hook} raised: {exc!r}")
                continue
            pairs.extend((info, d) for d in result)
    return items


def _fail(info: PluginInfo, reason: str) -> None:
    info.status = "failed"
    info.error = reason
    log.error("plugin %s disabled: %s", info.name, reason)
