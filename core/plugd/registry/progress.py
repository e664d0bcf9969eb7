"""Progress of a transfer as Ollama reports it: status lines, and per-layer lines with `total` and `completed`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

Emit = Callable[[dict[str, Any]], None]


class Progress:
    """A layer's updates go out when its count changed, at most every `interval` seconds; its last one always."""

    def __init__(self, emit: Emit, verb: str, interval: float = 0.1):
        self.emit = emit
        self.verb = verb
        self.interval = interval
        self.lock = threading.Lock()
        self.last_sent: dict[str, tuple[float, int]] = {}

    def status(self, text: str) -> None:
        with self.lock:
            self.emit({"status": text})

    def layer(self, digest: str, total: int, completed: int, label: str | None = None) -> None:
        """`label` names the layer in its status line (a file's name); by default, its digest's first 12 digits."""
        now = time.monotonic()
        with self.lock:
            sent_at, sent = self.last_sent.get(digest, (-self.interval, -1))
            if completed == sent or (completed < total and now - sent_at < self.interval):
                return
            self.last_sent[digest] = (now, completed)
            self.emit({"status": f"{self.verb} {label or digest.removeprefix('sha256:')[:12]}", "digest": digest,
                       "total": total, "completed": completed})
