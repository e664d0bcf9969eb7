"""The plugin manager: built-in plugins, entry points in the group "plugd", and the registry of what they give.

`PLUGD_PLUGINS` restricts which entry-point plugins load: unset loads all,
an empty value loads none, otherwise a comma-separated list of entry-point or
distribution names. Built-in plugins always load. A plugin that fails to
import, or whose hook raises or returns something that is not its hook's
descriptor, is reported (a log line and its listing status) and contributes
nothing; the daemon goes on without it. So is a plugin built for a plugin API
this plugd does not implement: its module-level `PLUGD_API` is checked against
`hookspecs.PLUGIN_API_VERSION` before any of its hooks is registered.

`PLUGD_TRACE_PLUGINS` logs every hook call and every call into what the hooks
returned (render, parse, detect, ...) with a summary of arguments, result and
time: `1` traces every plugin, a comma-separated list of names only those.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable, Collection, Iterable
from importlib import metadata
from types import ModuleType
from typing import Any

import attrs
import pluggy
from attrs import define, field

from plugd import __version__, hookspecs
from plugd.builtins import BUILTIN_MODULES

log = logging.getLogger(__name__)
trace_log = logging.getLogger(__name__ + ".trace")
ENTRY_POINT_GROUP = "plugd"
API_ATTRIBUTE = "PLUGD_API"
TRACE_ALL = "*"  # in `traced`: every plugin
SUMMARY_CHARS = 160
DESCRIPTORS = tuple(hookspecs.HOOKS.values())


@define
class PluginInfo:
    name: str
    version: str
    hooks: list[str] = field(factory=list)
    status: str = "ok"  # ok | failed | disabled
    error: str | None = None
    builtin: bool = False
    provides: dict[str, list[str]] = field(factory=dict)
    api: str | None = None  # the plugin API version the plugin declares it was built for


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


def _entry_points() -> Iterable[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def _api_parts(version: object) -> tuple[int, int] | None:
    """(MAJOR, MINOR) of a "MAJOR.MINOR" (or "MAJOR") string; None for anything else."""
    match = re.fullmatch(r"(\d+)(?:\.(\d+))?", version) if isinstance(version, str) else None
    return (int(match[1]), int(match[2] or 0)) if match else None


def api_refusal(declared: object) -> str | None:
    """Why a plugin that declares `PLUGD_API = declared` cannot load into this plugd, or None when it can."""
    core = hookspecs.PLUGIN_API_VERSION
    core_major, core_minor = _api_parts(core)
    parts = _api_parts(declared)
    if parts is None:
        return f'declares {API_ATTRIBUTE} = {declared!r}, not a "MAJOR.MINOR" string; this plugd has plugin API {core}'
    if parts[0] == core_major and parts[1] <= core_minor:
        return None
    newer = parts > (core_major, core_minor)
    remedy = "upgrade plugd or install an older release of the plugin" if newer else "upgrade the plugin"
    return f"built for plugd plugin API {declared}, but this plugd has plugin API {core}: {remedy}"


def _summary(value: Any) -> str:
    if isinstance(value, list) and all(isinstance(v, DESCRIPTORS) for v in value):
        return "[" + ", ".join(f"{type(v).__name__} {_descriptor_name(v)}" for v in value) + "]"
    text = repr(value)
    return text if len(text) <= SUMMARY_CHARS else f"{text[:SUMMARY_CHARS]}... ({len(text)} chars)"


def _traced_call(label: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def traced(*args: Any, **kwargs: Any) -> Any:
        arguments = ", ".join([_summary(a) for a in args] + [f"{k}={_summary(v)}" for k, v in kwargs.items()])
        started = time.perf_counter()
        try:
            result = function(*args, **kwargs)
        except Exception as exc:
            trace_log.info("%s(%s) raised %r (%.1f ms)", label, arguments, exc, _ms_since(started))
            raise
        trace_log.info("%s(%s) -> %s (%.1f ms)", label, arguments, _summary(result), _ms_since(started))
        return result

    return traced


def _traced_descriptor(plugin: str, descriptor: Any) -> Any:
    """`descriptor` with each of its callables logging its calls."""
    prefix = f"{plugin}: {type(descriptor).__name__} {_descriptor_name(descriptor)}"
    changes = {
        f.name: _traced_call(f"{prefix}.{f.name}", value)
        for f in attrs.fields(type(descriptor))
        if callable(value := getattr(descriptor, f.name))
    }
    return attrs.evolve(descriptor, **changes)


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def load(enabled: Collection[str] | None = None, traced: Collection[str] = ()) -> Registry:
    """Load built-in and entry-point plugins and collect what their hooks return: of the entry points, those
    `enabled` names (by entry point or distribution; None: all). Hook calls of the plugins `traced` names (TRACE_ALL:
    every one) are logged (PLUGD_PLUGINS and PLUGD_TRACE_PLUGINS, in plugd.settings.Settings)."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    infos: list[PluginInfo] = []
    modules: list[tuple[PluginInfo, ModuleType]] = []

    for module in BUILTIN_MODULES:
        info = PluginInfo(
            name=module.__name__.rsplit(".", 1)[-1], version=__version__, builtin=True, api=hookspecs.PLUGIN_API_VERSION
        )
        infos.append(info)
        modules.append((info, module))

    for ep in _entry_points():
        dist = ep.dist
        info = PluginInfo(name=ep.name, version=dist.version if dist else "?")
        infos.append(info)
        if enabled is not None and not ({ep.name, dist.name if dist else ""} & set(enabled)):
            info.status = "disabled"
            continue
        try:
            module = ep.load()
        except Exception as exc:  # a plugin's import can fail in any way
            _fail(info, f"import failed: {exc!r}")
            continue
        declared = getattr(module, API_ATTRIBUTE, None)
        info.api = None if declared is None else str(declared)
        if declared is not None and (refusal := api_refusal(declared)):
            _fail(info, refusal)
            continue
        modules.append((info, module))

    for info, module in modules:
        try:
            pm.register(module, name=f"{'builtin' if info.builtin else 'plugin'}:{info.name}")
        except Exception as exc:  # pluggy validation of hook names and signatures
            _fail(info, f"registration failed: {exc}")
            continue
        if unknown := _unknown_hooks(pm, module):
            _fail(info, f"implements no hook of this plugd: {', '.join(unknown)} (plugd's hooks: {', '.join(hookspecs.HOOKS)})")
            continue
        info.hooks = sorted(impl_name for impl_name in dir(module) if impl_name in hookspecs.HOOKS)

    items = _collect(pm, {id(m): info for info, m in modules}, traced)
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


def _unknown_hooks(pm: pluggy.PluginManager, module: ModuleType) -> list[str]:
    """Hook implementations in `module` that name no hook (a typo would otherwise do nothing, silently);
    `@hookimpl(optionalhook=True)` marks one as meant for a plugd that has that hook."""
    unknown = []
    for name in dir(module):
        options = pm.parse_hookimpl_opts(module, name)
        if options is not None and name not in hookspecs.HOOKS and not options.get("optionalhook"):
            unknown.append(name)
    return unknown


def _collect(
    pm: pluggy.PluginManager, info_of: dict[int, PluginInfo], traced: Collection[str]
) -> dict[str, list[tuple[PluginInfo, Any]]]:
    """Call each implementation of each hook on its own, so one raising plugin cannot hide the others."""
    items: dict[str, list[tuple[PluginInfo, Any]]] = {}
    for hook, descriptor in hookspecs.HOOKS.items():
        pairs = items.setdefault(hook, [])
        # pluggy lists implementations oldest first; later registrations (third-party) take priority.
        for impl in reversed(getattr(pm.hook, hook).get_hookimpls()):
            info = info_of[id(impl.plugin)]
            if info.status == "failed":
                continue
            tracing = TRACE_ALL in traced or info.name in traced
            call = _traced_call(f"{info.name}: {hook}", impl.function) if tracing else impl.function
            try:
                result = list(call() or ())
                bad = [r for r in result if not isinstance(r, descriptor)]
                if bad:
                    raise TypeError(f"returned {bad[0]!r}, expected {descriptor.__name__} instances")
            except Exception as exc:  # a plugin's hook can fail in any way
                _fail(info, f"{hook} raised: {exc!r}")
                continue
            if tracing:
                result = [_traced_descriptor(info.name, d) for d in result]
            pairs.extend((info, d) for d in result)
    return items


def _fail(info: PluginInfo, reason: str) -> None:
    info.status = "failed"
    info.error = reason
    log.error("plugin %s disabled: %s", info.name, reason)
