"""Fixtures for plugd's tests and for plugin authors' tests (registered as a pytest11 plugin)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.server import LiveServer


@pytest.fixture
def plugd_server(tmp_path: Path) -> Iterator[LiveServer]:
    """A running `plugd serve` on a free loopback port with an empty model store of its own."""
    server = LiveServer(tmp_path / "models")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def tiny_qwen3(tmp_path: Path) -> Path:
    """A tiny random-weight qwen3 checkpoint directory in the Hugging Face layout."""
    return write_checkpoint(tmp_path / "tiny-qwen3", "qwen3", seed=0)
