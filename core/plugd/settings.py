"""Settings read from the environment, shared by the daemon and the CLI.

The daemon reads its settings once, at start (`Settings.from_environment`), and hands them to what needs them;
nothing it runs reads the environment again. (The registry client, which the CLI shares, reads its credentials'
and certificates' locations when a transfer starts.)
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from attrs import define, field

from plugd import plugins
from plugd.plugins import Registry
from plugd.protocol import PIPELINE, TENSOR
from plugd.scheduler.runner_group import Hosts

DEFAULT_PORT = 11434


@define(frozen=True)
class Variable:
    name: str
    default: str
    meaning: str


# Every environment variable the core reads: `plugd serve --help` lists these, and a test checks that the
# core reads no other. Plugins document their own.
ENVIRONMENT = (
    Variable("PLUGD_HOST", f"127.0.0.1:{DEFAULT_PORT}",
             "address to serve on and to reach the daemon at (host, host:port, :port, http://host:port); on a "
             "loopback address only requests naming a local host are answered, as Ollama does against DNS rebinding"),
    Variable("PLUGD_MODELS", "~/.plugd/models", "the model store"),
    Variable("PLUGD_NOPRUNE", "unset", "set to keep blobs no model refers to at start"),
    Variable("PLUGD_PLUGINS", "all", "comma-separated plugins to load; empty loads none (built-ins always load)"),
    Variable("PLUGD_TRACE_PLUGINS", "unset",
             "1 logs every plugin hook call (and calls into what hooks returned); or a comma-separated list of "
             "plugins to trace"),
    Variable("PLUGD_REGISTRY_AUTH", "~/.plugd/auth.json, then ~/.docker/config.json",
             "registry credentials (Docker config.json format)"),
    Variable("PLUGD_CA_BUNDLE", "SSL_CERT_FILE, else certifi's", "CA certificates trusted for registry https"),
    Variable("PLUGD_CACHE_POLICY", "prefix-cache when installed, else single-slot", "the runner's prompt-cache policy"),
    Variable("PLUGD_GRAMMAR_ENGINES", "every installed engine, by name (llguidance, then xgrammar)",
             "comma-separated grammar engines for structured output, tried in this order: the first that can "
             "enforce a request's format exactly serves it"),
    Variable("PLUGD_CLIENT_RENDERERS", "unset", "client renderer plugins to enable, e.g. claude-code"),
    Variable("PLUGD_KEEP_ALIVE", "5m",
             "how long an idle model stays loaded; 0 unloads after each request, negative keeps it"),
    Variable("PLUGD_MAX_LOADED_MODELS", "unlimited", "models loaded at once; idle ones are evicted first"),
    Variable("PLUGD_MAX_QUEUE", "512", "requests waiting for a model before the daemon answers 503"),
    Variable("PLUGD_NUM_PARALLEL", "OLLAMA_NUM_PARALLEL, else 4 where memory allows",
             "requests one model decodes together; more wait for a slot"),
    Variable("PLUGD_HOSTFILE", "unset (one process per model)",
             "an MLX host file (ring backend; rank 0 this machine): every generative model is served split across "
             "its hosts, one rank each"),
    Variable("PLUGD_GROUP_SPLIT", "tensor where the architecture says how, else pipeline",
             "how a PLUGD_HOSTFILE group splits a model: tensor (every layer's heads and hidden units shared out, "
             "two all-sums per layer and token) or pipeline (consecutive layers per host, one transfer per host and "
             "token: better over slow links)"),
    Variable("PLUGD_CONTEXT_LENGTH", "each model's maximum, lowered to what its caches fit in the memory left "
             "after its weights and prompt cache, at least 4096", "num_ctx of requests that set none"),
    Variable("PLUGD_LOAD_TIMEOUT", "600", "seconds a runner may take to load its model"),
    Variable("PLUGD_RUNNER_TIMEOUT", "120", "seconds a loaded runner may go without progress (a prefill chunk, a "
             "token, a status answer) before it is killed as wedged and loaded again by the next request"),
    Variable("PLUGD_LOG_LEVEL", "INFO", "daemon and runner log level; DEBUG also logs each rendered prompt"),
    Variable("PLUGD_ORIGINS", "unset",
             "comma-separated web origins (* as a wildcard) that may call the API from a browser, besides Ollama's "
             "defaults (localhost, 127.0.0.1 and 0.0.0.0 on any port; app://, file://, tauri://, vscode-webview://, "
             "vscode-file://)"),
)


def environment_help(width: int) -> str:
    """ENVIRONMENT as a help section: each name, then its meaning and default, wrapped to `width`."""
    indent = " " * (2 + max(len(v.name) for v in ENVIRONMENT) + 2)
    lines = ["environment variables:"]
    for v in ENVIRONMENT:
        text = f"{v.meaning} (default: {v.default})"
        lines.append(textwrap.fill(text, width, initial_indent=f"  {v.name}".ljust(len(indent)),
                                   subsequent_indent=indent))
    lines.append("Installed plugins may read more; each plugin's documentation says which.")
    return "\n".join(lines)


def daemon_address(environ: Mapping[str, str] = os.environ) -> tuple[str, int]:
    """Host and port from PLUGD_HOST (default 127.0.0.1:11434), read the way Ollama reads OLLAMA_HOST.

    Accepts `host`, `host:port`, `:port`, `[::1]:port` and `http://host:port`.
    """
    value = environ.get("PLUGD_HOST", "").strip() or "127.0.0.1"
    if "://" not in value:
        value = "http://" + value
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"invalid PLUGD_HOST {environ.get('PLUGD_HOST')!r}: bad port") from None
    return parts.hostname or "127.0.0.1", port if port is not None else DEFAULT_PORT


def daemon_url() -> str:
    host, port = daemon_address()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _names(value: str | None) -> tuple[str, ...]:
    return tuple(name.strip() for name in (value or "").split(",") if name.strip())


def _traced(value: str) -> tuple[str, ...]:
    if value.strip().lower() in ("1", "true", "yes", "all"):
        return (plugins.TRACE_ALL,)
    return () if value.strip() == "0" else _names(value)


def _number(name: str, value: str | None, kind: type, default: float | None) -> float | None:
    value = (value or "").strip()
    if not value:
        return default
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"invalid {name} {value!r}: expected {'a whole number' if kind is int else 'a number'}") \
            from None


def _parallel(environ: Mapping[str, str]) -> int | None:
    """PLUGD_NUM_PARALLEL, else OLLAMA_NUM_PARALLEL (as Ollama's users set it); None (from memory) when neither is
    set or it is 0."""
    name = "PLUGD_NUM_PARALLEL" if environ.get("PLUGD_NUM_PARALLEL", "").strip() else "OLLAMA_NUM_PARALLEL"
    parallel = _number(name, environ.get(name), int, None)
    if parallel is not None and parallel < 0:
        raise ValueError(f"invalid {name} {parallel}: expected a whole number of requests, 1 or more")
    return parallel or None


def _hosts(path: str, split: str) -> Hosts | None:
    split = split.strip().lower()
    if split not in ("", TENSOR, PIPELINE):
        raise ValueError(f"invalid PLUGD_GROUP_SPLIT {split!r}: expected {TENSOR} or {PIPELINE}")
    if not path:
        return None
    try:
        return Hosts.read(Path(path).expanduser(), split or None)
    except ValueError as exc:
        raise ValueError(f"invalid PLUGD_HOSTFILE: {exc}") from None


@define(frozen=True, kw_only=True)
class Settings:
    """What the daemon runs with (ENVIRONMENT says what each means); the defaults are those of a bare environment."""

    address: tuple[str, int] = ("127.0.0.1", DEFAULT_PORT)
    models: Path = field(factory=lambda: Path.home() / ".plugd" / "models")
    prune: bool = True
    keep_alive: str = "5m"
    max_loaded_models: float = math.inf
    max_queue: int = 512
    num_parallel: int | None = None  # None: chosen from memory at each load
    context_length: int | None = None
    load_timeout: float = 600.0
    runner_timeout: float = 120.0
    log_level: str = "INFO"
    origins: tuple[str, ...] = ()
    cache_policy: str | None = None
    grammar_engines: tuple[str, ...] | None = None  # None: every installed engine
    client_renderers: tuple[str, ...] = ()
    plugins: tuple[str, ...] | None = None  # the plugins to load; None: all
    trace_plugins: tuple[str, ...] = ()  # those whose hook calls are logged; TRACE_ALL: every one
    hosts: Hosts | None = None  # a runner group's: every generative model is served over these hosts

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """The settings the environment gives (the class's defaults for what it leaves unset); ValueError naming
        the variable for one that cannot be read."""
        default = cls()
        return cls(
            address=daemon_address(environ),
            models=Path(environ["PLUGD_MODELS"]).expanduser() if environ.get("PLUGD_MODELS") else default.models,
            prune=not environ.get("PLUGD_NOPRUNE"),
            keep_alive=environ.get("PLUGD_KEEP_ALIVE") or default.keep_alive,
            max_loaded_models=(_number("PLUGD_MAX_LOADED_MODELS", environ.get("PLUGD_MAX_LOADED_MODELS"), int, 0)
                               or default.max_loaded_models),
            max_queue=_number("PLUGD_MAX_QUEUE", environ.get("PLUGD_MAX_QUEUE"), int, default.max_queue),
            num_parallel=_parallel(environ),
            context_length=_number("PLUGD_CONTEXT_LENGTH", environ.get("PLUGD_CONTEXT_LENGTH"), int,
                                   default.context_length),
            load_timeout=_number("PLUGD_LOAD_TIMEOUT", environ.get("PLUGD_LOAD_TIMEOUT"), float,
                                 default.load_timeout),
            runner_timeout=_number("PLUGD_RUNNER_TIMEOUT", environ.get("PLUGD_RUNNER_TIMEOUT"), float,
                                   default.runner_timeout),
            log_level=(environ.get("PLUGD_LOG_LEVEL") or default.log_level).upper(),
            origins=_names(environ.get("PLUGD_ORIGINS")),
            cache_policy=environ.get("PLUGD_CACHE_POLICY") or default.cache_policy,
            grammar_engines=_names(environ["PLUGD_GRAMMAR_ENGINES"]) if environ.get("PLUGD_GRAMMAR_ENGINES") else None,
            client_renderers=_names(environ.get("PLUGD_CLIENT_RENDERERS")),
            plugins=None if environ.get("PLUGD_PLUGINS") is None else _names(environ["PLUGD_PLUGINS"]),
            trace_plugins=_traced(environ.get("PLUGD_TRACE_PLUGINS", "")),
            hosts=_hosts(environ.get("PLUGD_HOSTFILE", "").strip(), environ.get("PLUGD_GROUP_SPLIT", "")),
        )

    def load_plugins(self) -> Registry:
        """The plugins these settings enable, loaded."""
        return plugins.load(self.plugins, self.trace_plugins)
