"""The daemon's handle on one runner process: spawn, wait until ready, talk over its socket, kill and reap."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing, nullcontext, suppress
from pathlib import Path
from typing import Any

import anyio
import attrs
import httpx
import psutil

from plugd.blas import with_openblas
from plugd.errors import PlugdError
from plugd.protocol import (
    DAEMON_PID_VARIABLE,
    Completion,
    DoneEvent,
    Embed,
    Embedded,
    ErrorEvent,
    PrefillEvent,
    RunnerConfig,
    TokenEvent,
    read_event,
)
from plugd.runner.errors import CHECKPOINT_REFUSED, FAILURE
from plugd.scheduler.memory import resident_bytes
from plugd.scheduler.runner_group import launch_command
from plugd.scheduler.runner_transport import RunnerTransport
from plugd.scratch import scratch_prefix
from plugd.types import structure, unstructure

log = logging.getLogger(__name__)

KEPT_LOG_LINES = 50


class RunnerError(PlugdError, RuntimeError):
    """The runner failed to load, died, or answered with an error."""


class UnloadableModel(RunnerError):
    """The runner could not load the model's checkpoint (its tensors do not fit, or are in a form plugd cannot run)."""

    status = 400


class RunnerRejected(RunnerError):
    """The runner refused the request as given (HTTP 400): a format it cannot enforce, say.

    `details` is the runner's answer: its "kind" of refusal and what goes with it (a prompt over the context
    is kind "context_exceeded", with "prompt_tokens" and "limit").
    """

    status = 400

    def __init__(self, details: dict[str, Any]):
        super().__init__(details.get("error", "the runner refused the request"))
        self.details = details
        self.kind = str(details.get("kind", self.kind))

    @classmethod
    def of(cls, response: httpx.Response) -> RunnerRejected:
        try:
            details = response.json()
        except ValueError:
            details = {"error": response.text}
        return cls(details if isinstance(details, dict) else {"error": response.text})


def runner_env() -> dict[str, str]:
    env = with_openblas(os.environ)
    # Loading frees many tensor-sized blocks (e.g. per-expert weights once stacked). Past glibc's dynamic
    # threshold they come from the heap and stay resident; a fixed threshold hands them back at once.
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    return env


class RunnerProcess:
    """One `plugd runner` child. `start` and `close` are serialised; once closing has begun, start refuses.

    It may take `load_timeout` seconds to load. Loaded, it writes at least once per prefill chunk and per
    generated token, and answers a status call at once; one silent for `progress_timeout` seconds (a status call:
    10 at most) is wedged (stopped, deadlocked, swapping): it is killed, its requests fail saying so, and the next
    request loads the model again.
    """

    def __init__(self, files: dict[str, Path], config: RunnerConfig, load_timeout: float = 600.0,
                 progress_timeout: float = 120.0):
        self.files = files
        self.config = config
        self.load_timeout, self.progress_timeout = load_timeout, progress_timeout
        self.status_timeout = min(10.0, progress_timeout)
        self.workdir = Path(tempfile.mkdtemp(prefix=scratch_prefix("runner")))
        self.socket = self.workdir / "runner.sock"
        self.log_path = self.workdir / "runner.log"
        self.process: asyncio.subprocess.Process | None = None
        self.ranks: list[dict[str, Any]] = []  # a group's: each rank's host and pid, as rank 0 reports them
        self._last_lines: list[str] | None = None  # the log's last lines, once its folder is gone
        self.closing = False
        self._lock = asyncio.Lock()
        self.http = httpx.AsyncClient(
            transport=RunnerTransport(str(self.socket)), base_url="http://runner",
            timeout=httpx.Timeout(30.0, read=progress_timeout),
        )

    def _model_dir(self) -> Path:
        """The Hugging Face layout the runner loads: links named as the files, pointing at their blobs."""
        directory = self.workdir / "model"
        directory.mkdir()
        for name, blob in self.files.items():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / name).symlink_to(blob)
        return directory

    async def start(self) -> None:
        async with self._lock:
            if self.closing:
                raise RunnerError("runner is closing")
            runner = ["-m", "plugd", "runner", "--model-dir", str(self._model_dir()), "--socket", str(self.socket),
                      "--config", self.config.to_json()]
            group = self.config.group
            env = runner_env() | ({} if group is None else {DAEMON_PID_VARIABLE: str(os.getpid())})
            with self.log_path.open("wb") as log_file:
                self.process = await asyncio.create_subprocess_exec(
                    *([sys.executable, *runner] if group is None else launch_command(group, runner, self.workdir)),
                    stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=log_file, env=env,
                    start_new_session=group is not None,  # the launcher and its ranks, to be killed together
                )
            try:
                await asyncio.wait_for(self._wait_ready(), self.load_timeout)
            except TimeoutError:
                raise RunnerError(f"model did not load within {self.load_timeout:.0f}s") from None
            if group is not None:
                self.ranks = (await self.http.get("/status")).json().get("group", [])

    async def _wait_ready(self) -> None:
        while True:
            if self.process.returncode is not None:
                refused = (self._last_error() or "").startswith(CHECKPOINT_REFUSED)
                raise (UnloadableModel if refused else RunnerError)(self.failure())
            try:
                if (await self.http.get("/status")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)

    def failure(self) -> str:
        """Why the process ended, from its exit status and the last line it wrote."""
        if last := self._last_error():
            return last.removeprefix(CHECKPOINT_REFUSED).removeprefix(FAILURE)
        lines = self._log_lines()
        code = self.process.returncode if self.process else None
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with status {code}"
        return f"model runner {how}" + (f": {lines[-1]}" if lines else "")

    def _log_lines(self) -> list[str]:
        if self._last_lines is not None:
            return self._last_lines
        return self.log_path.read_text(errors="replace").strip().splitlines() if self.log_path.exists() else []

    def _last_error(self) -> str | None:
        """The last line saying why the runner could not load, if it wrote one."""
        return next((line for line in reversed(self._log_lines()) if line.startswith((CHECKPOINT_REFUSED, FAILURE))),
                    None)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def resident_bytes(self) -> int | None:
        return resident_bytes(self.pid) if self.pid else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None and not self.closing

    async def wait(self) -> int:
        return await self.process.wait()

    async def close(self) -> None:
        """Kill the process (a group: the launcher and every rank) and wait until it is reaped, so its memory
        is back before anything else loads."""
        async with self._lock:
            self.closing = True
            if self.process and self.process.returncode is None:
                self._kill()
                await self.process.wait()
            if self.config.group is not None:
                await self._ranks_gone()
            await self.http.aclose()
            self._last_lines = self._log_lines()[-KEPT_LOG_LINES:]  # for a failure() asked after the close
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _kill(self) -> None:
        if self.config.group is None:
            self.process.kill()
            return
        with suppress(ProcessLookupError):  # the launcher leads its session: ranks on this machine, ssh to others
            os.killpg(self.process.pid, signal.SIGKILL)

    async def _ranks_gone(self, timeout: float = 10.0) -> None:
        """Wait for this machine's ranks to end (a rank on another host ends with its ssh session)."""
        here = socket.gethostname()
        local = [rank["pid"] for rank in self.ranks if rank["host"] == here]
        deadline = time.monotonic() + timeout
        while any(process_alive(pid) for pid in local) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _group_ended(self, timeout: float = 5.0) -> None:
        """A group whose stream failed has lost a rank and is ending: wait for it, so that the message can say
        why, and the next request finds it gone and starts it again."""
        if self.config.group is not None:
            with suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.process.wait()), timeout)

    def _stop_wedged(self, silent_for: float) -> RunnerError:
        """Kill a runner that stopped answering (the scheduler's watch then forgets it); the error to raise."""
        if self.process is not None and self.process.returncode is None:
            log.error("model runner %d made no progress for %g s: killing it", self.process.pid, silent_for)
            self._kill()
        return RunnerError(f"the model runner made no progress for {silent_for:g} s and was stopped; "
                           "the next request loads the model again")

    async def embed(self, inputs: list[list[int]]) -> Embedded:
        """The runner's vectors for `inputs` (token ids); RunnerRejected for what it refuses."""
        try:
            response = await self.http.post("/embed", json=unstructure(Embed(inputs=inputs)))
        except httpx.ReadTimeout:
            raise self._stop_wedged(self.progress_timeout) from None
        except httpx.TransportError:
            await asyncio.sleep(0.05)  # let the exit status arrive so the message can say what happened
            raise RunnerError(self.failure() if self.process.returncode is not None else "runner unreachable") from None
        if response.status_code == 400:
            raise RunnerRejected.of(response)
        if response.is_error:
            raise RunnerError(RunnerRejected.of(response).details.get("error", response.text))
        return structure(response.json(), Embedded)

    async def status(self) -> dict[str, Any]:
        try:
            return (await self.http.get("/status", timeout=self.status_timeout)).json()
        except httpx.TimeoutException:
            raise self._stop_wedged(self.status_timeout) from None

    async def completion(self, body: Completion,
                         images: Mapping[str, bytes] = {}) -> AsyncIterator[PrefillEvent | TokenEvent | DoneEvent]:
        """The runner's events for `body`; a failure it reports, or a runner that dies mid-stream, raises
        RunnerError. `images` are the bytes of `body.media`'s images, by digest: written to files in the runner's
        folder that the body names, removed once the completion is over."""
        with tempfile.TemporaryDirectory(dir=self.workdir, prefix="media-") if body.media else nullcontext() as folder:
            if body.media:
                await anyio.to_thread.run_sync(_write_images, Path(folder), images)
                body = attrs.evolve(body, media=[attrs.evolve(span, path=str(Path(folder) / span.digest))
                                                 for span in body.media])
            async with aclosing(self._events(body)) as events:
                async for event in events:
                    yield event

    async def _events(self, body: Completion) -> AsyncIterator[PrefillEvent | TokenEvent | DoneEvent]:
        try:
            async with self.http.stream("POST", "/completion", json=unstructure(body)) as response:
                if response.status_code == 400:
                    await response.aread()
                    raise RunnerRejected.of(response)
                async for line in response.aiter_lines():
                    if line:
                        event = read_event(line)
                        if isinstance(event, ErrorEvent):
                            if event.kind is not None:  # the request's, not the runner's: a 400 where not begun
                                raise RunnerRejected({"error": event.error, "kind": event.kind})
                            await self._group_ended()
                            raise RunnerError(event.error)
                        yield event
        except httpx.ReadTimeout:
            raise self._stop_wedged(self.progress_timeout) from None
        except (httpx.TransportError, ValueError):
            await asyncio.sleep(0.05)  # let the exit status arrive so the message can say what happened
            await self._group_ended()
            raise RunnerError(
                self.failure() if self.process.returncode is not None else "lost the connection to the model runner"
            ) from None


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists and has not ended (a zombie has ended, only not yet been reaped)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _write_images(folder: Path, images: Mapping[str, bytes]) -> None:
    for digest, data in images.items():
        (folder / digest).write_bytes(data)
