"""Built-in memory fit: models may use what they hold now plus the memory the system reports as available."""

from __future__ import annotations

import os

from plugd.hookspecs import MemoryFit, hookimpl
from plugd.procfs import kib_field


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo on Linux; free physical pages elsewhere when the platform reports them."""
    if (available := kib_field("/proc/meminfo", "MemAvailable")) is not None:
        return available
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def budget(held: int) -> int | None:
    available = available_bytes()
    return None if available is None else available + held


@hookimpl
def plugd_memory_fits():
    return [MemoryFit(name="system-memory", budget=budget)]
