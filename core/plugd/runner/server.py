"""`plugd runner`: one model, served over HTTP on a Unix socket to the daemon that spawned it.

Routes: GET /status (memory figures), POST /completion (NDJSON events),
POST /tokenize, POST /detokenize. All MLX work runs on one dedicated thread,
since MLX streams are thread-local; completions queue behind each other there.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import importlib
import json
import logging
import os
import resource
import sys
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import uvicorn
from litestar import Litestar, Request, Response, get, post
from litestar.datastructures import State
from litestar.response import Stream

from plugd.runner.generate import CompletionRequest, DoneEvent, Engine, TokenEvent
from plugd.runner.loading import load_model
from plugd.runner.tokenizer import Tokenizer
from plugd.types import structure

log = logging.getLogger("plugd.runner")


class ModelHost:
    """The loaded model and the single thread every MLX call runs on."""

    def __init__(self, model_dir: Path, module: str):
        self.mlx = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlx")
        started = time.perf_counter()
        self.engine: Engine = self.mlx.submit(self._load, model_dir, module).result()
        self.load_seconds = time.perf_counter() - started

    @staticmethod
    def _load(model_dir: Path, module: str) -> Engine:
        model = load_model(model_dir, importlib.import_module(module))
        _return_freed_heap()
        return Engine(model, Tokenizer.from_dir(model_dir))

    def memory(self) -> dict[str, int]:
        return {
            "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "rss": _current_rss(),
            "mlx_active": mx.get_active_memory(),
            "mlx_cache": mx.get_cache_memory(),
            "mlx_peak": mx.get_peak_memory(),
        }

    async def stream(self, request: CompletionRequest, prompt: str | None) -> AsyncIterator[bytes]:
        """Run a completion on the MLX thread, yielding NDJSON lines; stopping early cancels it.

        `prompt`, when given, is tokenized there and replaces `request.tokens`.
        """
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        cancelled = threading.Event()

        def produce() -> None:
            try:
                if prompt is not None:
                    request.tokens = self.engine.tokenizer.encode(prompt)
                for event in self.engine.complete(request, cancelled.is_set):
                    loop.call_soon_threadsafe(events.put_nowait, event)
            except Exception as exc:  # reported to the daemon as an error line
                log.exception("completion failed")
                loop.call_soon_threadsafe(events.put_nowait, exc)
            loop.call_soon_threadsafe(events.put_nowait, None)

        work = loop.run_in_executor(self.mlx, produce)
        try:
            while (event := await events.get()) is not None:
                if isinstance(event, Exception):
                    yield _line({"error": f"generation failed: {event}"})
                    continue
                yield _line(self._event_json(event))
        finally:
            cancelled.set()
            await work


    def _event_json(self, event: TokenEvent | DoneEvent) -> dict[str, Any]:
        if isinstance(event, DoneEvent):
            return attrs.asdict(event) | {"done": True}
        token_text = self.engine.tokenizer.token_text
        return {
            "done": False,
            "text": event.text,
            "token": event.token,
            "token_text": token_text(event.token),
            "logprob": event.logprob,
            "top_logprobs": [[token_text(t), lp] for t, lp in event.top_logprobs],
        }


def _return_freed_heap() -> None:
    """Give the memory the load freed back to the system (glibc keeps freed heap pages resident otherwise)."""
    if sys.platform == "linux" and (libc := ctypes.util.find_library("c")):
        ctypes.CDLL(libc).malloc_trim(0)


def _line(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode() + b"\n"


def _current_rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _host(request: Request) -> ModelHost:
    return request.app.state.host


@get("/status")
async def status(request: Request) -> dict[str, Any]:
    host = _host(request)
    return {"status": "ready", "load_seconds": host.load_seconds, "memory": host.memory()}


@post("/completion", status_code=200)
async def completion(request: Request) -> Stream:
    data = await request.json()
    prompt = data.pop("prompt", None)
    body = structure({"tokens": []} | data, CompletionRequest)
    return Stream(_host(request).stream(body, prompt), media_type="application/x-ndjson")


@post("/tokenize", status_code=200)
async def tokenize(request: Request) -> dict[str, Any]:
    text = (await request.json())["text"]
    # The tokenizers library needs no MLX, so this need not queue behind a generation on the MLX thread.
    return {"tokens": await asyncio.to_thread(_host(request).engine.tokenizer.encode, text)}


@post("/detokenize", status_code=200)
async def detokenize(request: Request) -> dict[str, Any]:
    tokens = (await request.json())["tokens"]
    return {"text": await asyncio.to_thread(_host(request).engine.tokenizer.decode, tokens)}


def _error(request: Request, exc: Exception) -> Response[Any]:
    log.exception("%s failed", request.url.path)
    return Response({"error": str(exc) or type(exc).__name__}, status_code=getattr(exc, "status_code", 500))


def main(model_dir: str, module: str, socket_path: str) -> int:
    logging.basicConfig(level=os.environ.get("PLUGD_LOG_LEVEL", "INFO").upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s runner[%(process)d]: %(message)s")
    try:
        host = ModelHost(Path(model_dir), module)
    except Exception as exc:  # the daemon reads this last line as the load error
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    app = Litestar(
        route_handlers=[status, completion, tokenize, detokenize],
        state=State({"host": host}),
        exception_handlers={Exception: _error},
        logging_config=None,
    )
    uvicorn.Server(uvicorn.Config(app, uds=socket_path, log_config=None, access_log=False)).run()
    return 0
