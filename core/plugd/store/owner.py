"""One daemon per model store: `plugd serve` holds an exclusive lock on the store while it runs, so a second one
on the same store (which would prune the first one's uploads in progress) exits at once, naming the first."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

LOCK_FILE = "daemon.lock"


class StoreInUse(RuntimeError):
    pass


class StoreOwner:
    """The lock, held from `claim` until the process exits (the kernel releases it, even after kill -9)."""

    def __init__(self, root: Path):
        self.path = Path(root) / LOCK_FILE
        self._file = None

    def claim(self, address: str) -> None:
        """Take the store, recording this process and `address` for a second daemon's message; StoreInUse when
        another live daemon holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        file = self.path.open("a+")
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            holder = _holder(file.read())
            file.close()
            raise StoreInUse(f"the model store {self.path.parent} is in use by another plugd serve"
                             f"{holder}; stop it first, or give this one PLUGD_MODELS of its own") from None
        file.truncate(0)
        file.write(json.dumps({"pid": os.getpid(), "address": address}))
        file.flush()
        self._file = file


def _holder(text: str) -> str:
    try:
        recorded = json.loads(text)
        return f" (pid {int(recorded['pid'])}, listening on {recorded['address']})"
    except (ValueError, KeyError, TypeError):
        return ""
