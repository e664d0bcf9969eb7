"""`plugd pull` and `plugd push`: the daemon moves the model; this draws its progress, one bar per layer with
size, rate and time left. On a terminal the lines are redrawn in place; elsewhere (a log, a pipe) each status
and each finished layer is printed once."""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any, TextIO

from plugd.cli import human_size
from plugd.client import DaemonClient

BAR_WIDTH = 25
RATE_WINDOW = 3.0  # seconds of history behind the rate shown
REDRAW_INTERVAL = 0.1


def transfer(verb: str, model: str, insecure: bool) -> None:
    board = ProgressBoard(sys.stderr)
    try:
        for item in DaemonClient().stream(f"/api/{verb}", {"model": model, "insecure": insecure, "stream": True}):
            board.update(item)
    finally:
        board.close()


def human_duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


class LayerLine:
    def __init__(self, status: str, total: int):
        self.status = status
        self.total = total
        self.completed = 0
        self.started = time.monotonic()
        self.finished: float | None = None
        self.samples: deque[tuple[float, int]] = deque()

    def update(self, completed: int, now: float) -> None:
        self.completed = completed
        self.samples.append((now, completed))
        while len(self.samples) > 2 and now - self.samples[0][0] > RATE_WINDOW:
            self.samples.popleft()
        if completed >= self.total and self.finished is None:
            self.finished = now

    @property
    def done(self) -> bool:
        return self.finished is not None

    def rate(self) -> float | None:
        """Bytes per second over the last few seconds; None until there is enough to tell."""
        (t0, c0), (t1, c1) = self.samples[0], self.samples[-1]
        return (c1 - c0) / (t1 - t0) if t1 - t0 > 0.2 else None

    def render(self) -> str:
        fraction = self.completed / self.total if self.total else 1.0
        filled = int(fraction * BAR_WIDTH)
        bar = "█" * filled + " " * (BAR_WIDTH - filled)
        head = f"{self.status}: {int(fraction * 100):3d}% ▕{bar}▏"
        if self.done:
            return f"{head} {human_size(self.total)}"
        line = f"{head} {human_size(self.completed)}/{human_size(self.total)}"
        if (rate := self.rate()) is not None:
            line += f"  {human_size(rate)}/s"
            if rate > 0:
                line += f"  {human_duration((self.total - self.completed) / rate)}"
        return line


class ProgressBoard:
    def __init__(self, out: TextIO):
        self.out = out
        self.tty = out.isatty()
        self.lines: dict[str, LayerLine | str] = {}
        self.drawn = 0
        self.last_draw = 0.0

    def update(self, item: dict[str, Any]) -> None:
        now = time.monotonic()
        status = item.get("status", "")
        digest, total = item.get("digest"), item.get("total")
        if digest and isinstance(total, int):
            line = self.lines.get(digest)
            if not isinstance(line, LayerLine):
                line = self.lines[digest] = LayerLine(status, total)
            was_done = line.done
            line.update(int(item.get("completed") or 0), now)
            if not self.tty and line.done and not was_done:
                print(line.render(), file=self.out, flush=True)
        elif status and status not in self.lines:
            self.lines[status] = status
            if not self.tty:
                print(status, file=self.out, flush=True)
            self.last_draw = 0.0  # a new status is drawn at once
        if self.tty and now - self.last_draw >= REDRAW_INTERVAL:
            self._redraw(now)

    def _redraw(self, now: float) -> None:
        text = [line.render() if isinstance(line, LayerLine) else line for line in self.lines.values()]
        up = f"\x1b[{self.drawn}F" if self.drawn else ""
        self.out.write(up + "".join(f"\x1b[2K{line}\n" for line in text))
        self.out.flush()
        self.drawn = len(text)
        self.last_draw = now

    def close(self) -> None:
        if self.tty:
            self._redraw(time.monotonic())
