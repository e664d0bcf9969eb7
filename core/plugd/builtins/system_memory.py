"""Built-in memory fit: a load may use at most the memory the system reports as available."""

from __future__ import annotations

import os

from plugd.hookspecs import MemoryFit, hookimpl


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo on Linux; free physical pages elsewhere when the platform reports them."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


@hookimpl
def plugd_memory_fits():
    return [MemoryFit(name="system-memory", available_bytes=available_bytes)]
