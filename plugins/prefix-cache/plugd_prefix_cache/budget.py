"""The prefix cache's default byte budget; free of MLX, as the daemon asks for it (see `CachePolicy.budget`)."""

from __future__ import annotations

import os

SHARE_OF_MEMORY = 8  # the default budget is this fraction of physical memory


def default_budget() -> int:
    """PLUGD_PREFIX_CACHE_BYTES, else an eighth of physical memory: small machines get a small cache."""
    if value := os.environ.get("PLUGD_PREFIX_CACHE_BYTES"):
        return int(value)
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // SHARE_OF_MEMORY
    except (ValueError, OSError):
        return 1 << 30
