"""Fixtures for plugd's tests and for plugin authors' tests (registered as the pytest11 plugin "plugd").

- `tiny_checkpoint(model_type, **options)`: a tiny random-weight checkpoint of any registered architecture
- `plugd_server`: a running `plugd serve` with every installed plugin and an empty model store
- `plugd_server_factory(plugins=None, env=None)`: more of them, with only the chosen plugins
- `plugd_temporary_plugins`: plugins that exist for one test (`.add(name, source)`, `.env()` for servers)
- `tiny_qwen3`: a tiny qwen3 checkpoint directory
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from plugd.testing.architectures import tiny_checkpoint as write_tiny_checkpoint
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.plugins import TemporaryPlugins
from plugd.testing.server import LiveServer


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Writes a fresh tiny checkpoint directory on each call: `tiny_checkpoint("qwen3", seed=1, dtype="bfloat16")`.

    Options are `write_checkpoint`'s (seed, dtype, shards, vocab_size, tokenizer, overrides). A model type
    the core does not know comes from its plugin's TINY_CONFIG (see plugd.testing.architectures).
    """

    def make(model_type: str = "qwen3", **options: Any) -> Path:
        return write_tiny_checkpoint(tmp_path_factory.mktemp(model_type), model_type, **options)

    return make


@pytest.fixture(scope="module")
def plugd_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LiveServer]]:
    """Starts `plugd serve` on a free loopback port, each with its own model store; all stop after the module.

    `plugins` names the entry points (or distributions) to load, as PLUGD_PLUGINS does; None loads all.
    """
    servers: list[LiveServer] = []

    def start(plugins: Iterable[str] | None = None, env: dict[str, str] | None = None) -> LiveServer:
        chosen = {} if plugins is None else {"PLUGD_PLUGINS": ",".join(plugins)}
        servers.append(LiveServer(tmp_path_factory.mktemp("plugd") / "models", env={**chosen, **(env or {})}))
        return servers[-1]

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def plugd_server(tmp_path: Path) -> Iterator[LiveServer]:
    """A running `plugd serve` on a free loopback port with an empty model store of its own."""
    server = LiveServer(tmp_path / "models")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def plugd_temporary_plugins(tmp_path: Path) -> Iterator[TemporaryPlugins]:
    """Plugins registered for this test only: `.add("shout", SOURCE)`, then `plugd.plugins.load()` or a server
    started with `env=plugd_temporary_plugins.env()` finds them."""
    with TemporaryPlugins(tmp_path / "temporary-plugins") as temporary:
        yield temporary


@pytest.fixture
def tiny_qwen3(tmp_path: Path) -> Path:
    """A tiny random-weight qwen3 checkpoint directory in the Hugging Face layout."""
    return write_checkpoint(tmp_path / "tiny-qwen3", "qwen3", seed=0)
