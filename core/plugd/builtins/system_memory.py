"""Built-in memory fit: models may use what they hold now plus the memory the system reports as available
(psutil's figure: MemAvailable on Linux, free plus inactive pages on macOS)."""

from __future__ import annotations

import psutil

from plugd.hookspecs import MemoryFit, hookimpl


def available_bytes() -> int | None:
    try:
        return psutil.virtual_memory().available
    except (OSError, RuntimeError):  # a platform psutil cannot read
        return None


def budget(held: int) -> int | None:
    available = available_bytes()
    return None if available is None else available + held


@hookimpl
def plugd_memory_fits():
    return [MemoryFit(name="system-memory", budget=budget)]
