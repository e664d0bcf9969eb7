"""Running a transfer's per-blob tasks side by side; the first failure stops the rest."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

from plugd.registry.errors import TransferCancelled


def run_all(tasks: list[Callable[[], None]], workers: int, cancel: threading.Event, name: str) -> None:
    """Run `tasks` on up to `workers` threads. When one fails, `cancel` is set so the others stop at their next
    step, and the first real failure is raised (not the cancellations it caused)."""
    if not tasks:
        return
    with ThreadPoolExecutor(min(workers, len(tasks)), thread_name_prefix=name) as pool:
        futures = [pool.submit(task) for task in tasks]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        if any(f.exception() for f in done):
            cancel.set()
        wait(futures)
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise next((e for e in errors if not isinstance(e, TransferCancelled)), errors[0])
