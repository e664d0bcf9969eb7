"""Scratch folders in the system's temporary directory, named after the process that owns them, so that those a
killed daemon left behind (runner sockets and logs, partial quantized output) are found and removed at the next
start while a live daemon's are left alone."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

KINDS = ("runner", "quantize")
_OWNED = re.compile(rf"plugd-({'|'.join(KINDS)})-(\d+)-")


def scratch_prefix(kind: str) -> str:
    """The prefix for tempfile.mkdtemp or TemporaryDirectory: `plugd-KIND-PID-`."""
    if kind not in KINDS:
        raise ValueError(f"unknown scratch kind {kind!r}")
    return f"plugd-{kind}-{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to judge
        return True
    return True


def remove_orphans(root: Path | None = None) -> list[Path]:
    """Remove the scratch folders whose owning process is gone; returns them."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob("plugd-*-*-*"):
        owned = _OWNED.match(path.name)
        if owned and path.is_dir() and not path.is_symlink() and not _alive(int(owned.group(2))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
