"""A real `plugd serve` on a free loopback port, for end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """A `plugd serve` subprocess with its own model store; `url` is ready once the constructor returns."""

    def __init__(self, models: Path, env: dict[str, str] | None = None, port: int | None = None, timeout: float = 30):
        self.models = Path(models)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.models.parent / f"plugd-serve-{self.port}.log"
        self.env = {**os.environ, "PLUGD_HOST": f"127.0.0.1:{self.port}", "PLUGD_MODELS": str(self.models), **(env or {})}
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "plugd", "serve"], env=self.env, stdout=self._log, stderr=subprocess.STDOUT
        )
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"plugd serve exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url, timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"plugd serve did not answer within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def cli(self, *args: str, input: str | None = None, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run the `plugd` CLI against this server."""
        return subprocess.run(
            [sys.executable, "-m", "plugd", *args], env=self.env, capture_output=True, text=True, input=input,
            check=check, timeout=120,
        )

    def runner_pids(self) -> list[int]:
        """Process ids of this daemon's live `plugd runner` children."""
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if int(fields[1]) == self.process.pid and fields[0] != "Z" and b"runner" in cmdline:
                pids.append(int(stat.parent.name))
        return pids

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()
