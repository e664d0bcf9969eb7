"""Many streaming clients at once against a live daemon, across the four dialects, some of them leaving mid-stream;
and the daemon's file descriptors and resident memory between rounds, to show that nothing accumulates.

tests/test_load.py runs a bounded round; bench/load.py the full size.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
from attrs import define, field


def _chat(model: str, prompt: str, tokens: int) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "options": {"num_predict": tokens}}


def _openai(model: str, prompt: str, tokens: int) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "stream": True}


def _responses(model: str, prompt: str, tokens: int) -> dict:
    return {"model": model, "input": prompt, "max_output_tokens": tokens, "stream": True}


def _anthropic(model: str, prompt: str, tokens: int) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "stream": True}


@define(frozen=True)
class Dialect:
    path: str
    body: Callable[[str, str, int], dict]
    ends: tuple[str, ...]  # a line that only a complete response has
    fails: tuple[str, ...]  # a line that starts an error event


DIALECTS = (
    Dialect("/api/chat", _chat, ('"done": true',), ('{"error"',)),
    Dialect("/v1/chat/completions", _openai, ("data: [DONE]",), ('data: {"error"',)),
    Dialect("/v1/responses", _responses, ("event: response.completed", "event: response.incomplete"),
            ("event: response.failed",)),
    Dialect("/v1/messages", _anthropic, ("event: message_stop",), ("event: error",)),
)


@define
class RoundResult:
    clients: int
    completed: int = 0
    disconnected: int = 0
    errors: list[str] = field(factory=list)  # what went wrong, one line per client it went wrong for
    seconds: float = 0.0


@define(frozen=True)
class DaemonFigures:
    open_files: int  # file descriptors, sockets included
    resident: int  # bytes


def daemon_figures(pid: int) -> DaemonFigures:
    fds = Path(f"/proc/{pid}/fd")
    count = len(list(fds.iterdir())) if fds.exists() else psutil.Process(pid).num_fds()
    return DaemonFigures(count, psutil.Process(pid).memory_info().rss)


async def _client(http: httpx.AsyncClient, url: str, dialect: Dialect, model: str, index: int, tokens: int,
                  leaves: bool, result: RoundResult) -> None:
    body = dialect.body(model, f"Client {index} says hello, round about {index * 7919 % 1000}.", tokens)
    seen: list[str] = []
    try:
        async with http.stream("POST", url + dialect.path, json=body) as response:
            if response.status_code != 200:
                result.errors.append(f"{dialect.path}: {response.status_code} {(await response.aread())[:200]!r}")
                return
            async for line in response.aiter_lines():
                if line.startswith(dialect.fails):
                    result.errors.append(f"{dialect.path}: {line[:300]}")
                    return
                if line and not line.startswith(":"):
                    seen.append(line)
                    if leaves:  # gone after the first event: mid-generation, or mid-prefill
                        result.disconnected += 1
                        return
    except httpx.HTTPError as exc:
        result.errors.append(f"{dialect.path}: {type(exc).__name__} {exc}")
        return
    if any(end in line for line in seen[-3:] for end in dialect.ends):
        result.completed += 1
    else:
        result.errors.append(f"{dialect.path}: the stream ended without its last event: {seen[-2:]}")


async def load_round(url: str, model: str, clients: int, leaving_every: int = 10, tokens: int = 8) -> RoundResult:
    """`clients` streaming requests at once, the dialects in turn; every `leaving_every`-th client disconnects
    after its first event. Each client has a connection of its own, closed when the round ends."""
    result = RoundResult(clients)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600, connect=30)) as http:
        await asyncio.gather(*(
            _client(http, url, DIALECTS[i % len(DIALECTS)], model, i, tokens, i % leaving_every == leaving_every - 1,
                    result)
            for i in range(clients)))
    result.seconds = loop.time() - started
    return result


async def settled_figures(pid: int, url: str, rounds: int = 50) -> DaemonFigures:
    """The daemon's figures once it is idle again: asked until its open files stop changing (closed connections
    are let go asynchronously)."""
    async with httpx.AsyncClient() as http:
        previous = None
        for _ in range(rounds):
            (await http.get(url + "/api/ps")).raise_for_status()
            figures = daemon_figures(pid)
            if previous is not None and figures.open_files == previous.open_files:
                return figures
            previous = figures
            await asyncio.sleep(0.1)
    return previous
