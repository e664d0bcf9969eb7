"""`plugd runner`: one model, served over HTTP on a Unix socket to the daemon that spawned it.

Routes: GET /status (memory figures), POST /completion (a plugd.protocol.Completion: token ids, and the images
by file; NDJSON events: the prefill's progress, tokens, done), POST /embed (an embedding model's: token ids in,
vectors out). All MLX work runs on one dedicated thread, since
MLX streams are thread-local; the completions under way are decoded together there, in one batch.

A completion with `truncate` false is refused with status 400 (kind "context_exceeded") when its prompt does
not fit num_ctx, instead of being truncated.

A completion with a `grammar` starts its prefill and its grammar's compilation
together; a grammar that cannot be enforced is answered with status 400 before
any output, and the prefill it started stays in the cache for the next request.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import importlib
import itertools
import logging
import os
import queue
import resource
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import mlx.core as mx
import uvicorn
from litestar import Litestar, Request, Response, get, post
from litestar.datastructures import State
from litestar.response import Stream
from PIL import Image

from plugd import protocol
from plugd.protocol import DAEMON_PID_VARIABLE, ErrorEvent, RunnerConfig, RunnerEvent, event_line
from plugd.runner.agreed_policy import AgreedPolicy
from plugd.runner.cache_policy import make_policy
from plugd.runner.draft import load_draft
from plugd.runner.drafting import drafter_of
from plugd.runner.embed import Embedder
from plugd.runner.errors import CHECKPOINT_REFUSED, FAILURE, CheckpointError
from plugd.runner.generate import Engine, prompt_limit
from plugd.runner.grammar import Grammars, TokenMaskFactory
from plugd.runner.group import Group
from plugd.runner.loading import compute_dtype, load_model
from plugd.runner.media import keyed
from plugd.runner.turns import Arrival, Player, Turn
from plugd.runner_api import GrammarDeadEnd, GrammarRefused, GrammarVocabulary
from plugd.tokenizer import Tokenizer
from plugd.types import structure, unstructure

log = logging.getLogger("plugd.runner")


class ModelHost:
    """The loaded model and the single thread every MLX call runs on; in a group, this rank's share of it."""

    def __init__(self, model_dir: Path, config: RunnerConfig, group: Group | None = None):
        self.group = group
        self.mlx = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlx")
        started = time.perf_counter()
        loaded = self.mlx.submit(self._load, model_dir, config).result()
        self.engine: Engine | None = loaded if isinstance(loaded, Engine) else None
        self.embedder: Embedder | None = loaded if isinstance(loaded, Embedder) else None
        self.ranks = [] if group is None else self.mlx.submit(group.ranks).result()
        self.load_seconds = time.perf_counter() - started
        self.grammars = Grammars(lambda: GrammarVocabulary.of(self.engine.tokenizer, self.engine.logits_width),
                                 config.grammar_engines)
        self.stop: Callable[[], None] = lambda: None  # ends the server; main sets it
        self.completions = Completions(self)

    def _load(self, model_dir: Path, config: RunnerConfig) -> Engine | Embedder:
        group = None if self.group is None else self.group.group
        model = load_model(model_dir, importlib.import_module(config.module), embedding=config.embedding is not None,
                           group=group, split=None if config.group is None else config.group.split)
        _return_freed_heap()
        if config.embedding is not None:
            return Embedder(model, config.embedding, model_dir)
        budget = config.cache_budget
        log.info("cache policy %s%s", config.cache_policy, "" if budget is None else f", budget {budget} bytes")
        log.info("%d completion(s) at once", config.num_parallel)

        def policy(loaded: Any) -> Any:
            made = make_policy(config.cache_policy, loaded, budget)
            return made if self.group is None else AgreedPolicy(made, self.group)

        agree = {} if self.group is None else {"agree": self.group.agree}
        # A group decodes plainly: its ranks would have to agree on every round's kept tokens too.
        drafter = None if self.group is not None else drafter_of(model, load_draft(model_dir, config.draft_module))
        return Engine(model, Tokenizer.from_dir(model_dir), cache_policy=policy, one_at_a_time=config.num_parallel == 1,
                      burst_chunks=config.num_parallel, drafter=drafter, **agree)

    def memory(self) -> dict[str, int]:
        return {
            "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "rss": _current_rss(),
            "mlx_active": mx.get_active_memory(),
            "mlx_cache": mx.get_cache_memory(),
            "mlx_peak": mx.get_peak_memory(),
        }

    def follow(self) -> int:
        """A follower's life: take the leader's turns until it is gone (then 1)."""
        return self.mlx.submit(self._follow).result()

    def _follow(self) -> int:
        player = Player(self.engine, self._follower_outlet)
        while True:
            try:
                turn = self.group.share() or Turn()
            except RuntimeError as exc:
                log.error("rank %d: the group is broken (%s); exiting", self.group.rank, exc)
                return 1
            player.play(turn)
            if not self.engine.idle:
                try:
                    self.engine.step()
                except Exception:  # as on the leader, where the same step fails the same way
                    log.exception("a generation step failed")

    def _follower_outlet(self, arrival: Arrival) -> tuple[Callable[[Any], None], Callable[[], Any] | None]:
        """A follower's events go nowhere; its grammar is its own, compiled alike, so its masks agree."""
        grammar = arrival.request.grammar
        compiled = None if grammar is None else self.grammars.compile(grammar)
        return _follower_events, None if compiled is None else (lambda: compiled.result()())


def _follower_events(event: Any) -> None:
    """A follower's events go nowhere (the leader's go to the daemon), but for its failures, which it logs."""
    if isinstance(event, Exception):
        log.warning("a completion failed on this rank: %s", event, exc_info=event)


class GroupBroken(RuntimeError):
    """A rank of the runner group is gone: the group cannot go on, and its requests fail."""


class Completions:
    """Feeds the engine the completions that arrive, a turn (plugd.runner.turns) before each step, and steps it
    on the MLX thread while it has work: the completions under way decode together there (plugd.runner.generate).
    A group's leader shares each turn with the followers first."""

    def __init__(self, host: ModelHost):
        self._host = host
        self._arrivals: queue.SimpleQueue[Running] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stepping = False
        self._numbers = itertools.count()
        self._live: dict[int, Running] = {}  # the completions handed on and not yet ended, by number
        self._told: set[int] = set()  # those of them whose cancellation a turn has carried
        self._player = None if host.engine is None else Player(host.engine, self._outlet)

    def start(self, running: Running) -> None:
        """Hand `running` to the engine at its next turn."""
        self._arrivals.put(running)
        with self._lock:
            if self._stepping:
                return
            self._stepping = True
        self._host.mlx.submit(self._run)

    def _run(self) -> None:
        engine = self._host.engine
        while True:
            turn = self._turn()
            if self._host.group is not None:
                try:
                    self._host.group.share(turn if turn.arrivals or turn.cancelled else None)
                except RuntimeError as exc:
                    self._break(GroupBroken(f"a rank of the runner group is gone ({exc})"))
                    return
            self._player.play(turn)
            if engine.idle:
                with self._lock:
                    if self._arrivals.empty():
                        self._stepping = False
                        return
                continue
            try:
                engine.step()
            except Exception:  # the engine ends the sequences a failure concerns; this is a bug of its own
                log.exception("a generation step failed")

    def _turn(self) -> Turn:
        arrivals = []
        while not self._arrivals.empty():
            running = self._arrivals.get()
            number = next(self._numbers)
            self._live[number] = running
            arrivals.append(Arrival(number, running.request, running.keys, running.images))
        cancelled = frozenset(n for n, running in self._live.items() if running.cancelled and n not in self._told)
        self._told |= cancelled
        return Turn(tuple(arrivals), cancelled)

    def _outlet(self, arrival: Arrival) -> tuple[Callable[[Any], None], Callable[[], Any] | None]:
        running = self._live[arrival.number]

        def send(event: Any) -> None:
            if event is None:
                self._live.pop(arrival.number, None)
                self._told.discard(arrival.number)
            running.send(event)

        return send, running.mask

    def _break(self, error: GroupBroken) -> None:
        """Fail every completion the group had or was about to get, and end the server."""
        log.error("%s: failing %d completion(s) and exiting", error, len(self._live))
        waiting = []
        while not self._arrivals.empty():
            waiting.append(self._arrivals.get())
        for running in [*self._live.values(), *waiting]:
            running.send(error)
            running.send(None)
        self._live.clear()
        self._host.stop()


class Running:
    """One completion, handed to the engine at its next turn, its events queued for the HTTP response.

    `keys` are the prompt's cache keys and `images` its images by key (plugd.runner.media.keyed); `grammar`
    (being compiled) is waited for only once the prefill is done.
    """

    def __init__(self, host: ModelHost, request: protocol.Completion, keys: list[int], images: dict[int, Image.Image],
                 grammar: Future[TokenMaskFactory] | None):
        self.request, self.keys, self.images = request, keys, images
        self.mask = None if grammar is None else lambda: grammar.result()()
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue = asyncio.Queue()
        self._cancelled = threading.Event()
        self._ended = self._loop.create_future()
        host.completions.start(self)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def send(self, event: RunnerEvent | Exception | None) -> None:
        self._loop.call_soon_threadsafe(self._deliver, event)

    def _deliver(self, event: RunnerEvent | Exception | None) -> None:
        if self._ended.done():
            return
        self._events.put_nowait(event)
        if event is None:
            self._ended.set_result(None)

    async def lines(self) -> AsyncIterator[bytes]:
        """The completion's NDJSON lines; stopping early cancels it."""
        try:
            while (event := await self._events.get()) is not None:
                if isinstance(event, GrammarRefused):
                    continue  # the request was already answered with the refusal
                if isinstance(event, GrammarDeadEnd):
                    yield event_line(ErrorEvent(str(event), kind="grammar_dead_end"))
                    continue
                if isinstance(event, Exception):
                    log.error("completion failed: %s", event, exc_info=event)
                    yield event_line(ErrorEvent(f"generation failed: {event}"))
                    continue
                yield event_line(event)
        finally:
            await self.cancel()

    async def cancel(self) -> None:
        """Stop at the next prefill chunk or decode step, and wait until the engine is done with it."""
        self._cancelled.set()
        await asyncio.shield(self._ended)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
HEAP_REUSE_BYTES = 32 << 20  # glibc's largest mmap threshold on 64-bit


def _return_freed_heap() -> None:
    """Give the memory the load freed back to the system (glibc keeps freed heap pages resident otherwise), then
    let the heap keep and reuse what later work frees. The load runs with a small fixed mmap threshold
    (runner_env), so that each tensor-sized block it frees goes back at once; left so, every large allocation
    after it (numpy's temporaries on the CPU paths, plugd.nn.host) is a fresh mapping whose pages fault in anew,
    which halved a CPU forward pass's speed (a 6-layer embedder: 54 against 107 inputs/s)."""
    if sys.platform == "linux" and (libc := ctypes.util.find_library("c")):
        glibc = ctypes.CDLL(libc)
        glibc.malloc_trim(0)
        glibc.mallopt(M_MMAP_THRESHOLD, HEAP_REUSE_BYTES)
        glibc.mallopt(M_TRIM_THRESHOLD, 2 * HEAP_REUSE_BYTES)


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
    # Read off the MLX thread: a snapshot of two counters, good enough for a status line.
    cache = {} if host.engine is None else {"cache": host.engine.cache.stats() | {
        "live_bytes": host.engine.live_bytes()}}
    group = {"group": host.ranks} if host.ranks else {}
    speculator = None if host.engine is None else host.engine.speculator
    drafting = {} if speculator is None else {"drafting": speculator.stats()}
    return {"status": "ready", "load_seconds": host.load_seconds, "memory": host.memory(),
            "device": mx.default_device().type.name, "float_bytes": compute_dtype().size} | cache | group | \
        drafting | _working_set()


def _working_set() -> dict[str, int]:
    """On Metal, the most the GPU should hold at once (Metal's recommendedMaxWorkingSetSize), which bounds all
    loaded models together however much memory the system reports free: past it, Metal pages."""
    if not mx.metal.is_available():
        return {}
    return {"working_set_bytes": int(mx.device_info()["max_recommended_working_set_size"])}


@post("/embed", status_code=200)
async def embed(request: Request) -> Response[Any] | dict[str, Any]:
    host = _host(request)
    if host.embedder is None:
        return _rejection("this model does not embed: it is not an embedding model", "not_embedding")
    try:
        body = structure(await request.json(), protocol.Embed)
    except ValueError as exc:
        return _rejection(f"invalid embed request: {exc}", "invalid")
    started = time.perf_counter_ns()
    try:
        vectors = await asyncio.get_running_loop().run_in_executor(host.mlx, host.embedder.embed, body.inputs)
    except ValueError as exc:
        return _rejection(str(exc), "invalid")
    return unstructure(protocol.Embedded(embeddings=vectors, duration=time.perf_counter_ns() - started))


@post("/completion", status_code=200)
async def completion(request: Request) -> Response[Any] | Stream:
    try:
        body = structure(await request.json(), protocol.Completion)
    except ValueError as exc:
        return _rejection(f"invalid completion: {exc}", "invalid")
    host = _host(request)
    if host.engine is None:
        return _rejection("this is an embedding model: it does not generate", "not_generative")
    try:  # read and decoded off the event loop, but not on the MLX thread: nothing of MLX is needed
        keys, images = await asyncio.to_thread(keyed, body.tokens, body.media)
    except ValueError as exc:
        return _rejection(str(exc), "media")
    prompt_tokens = len(body.tokens)
    if not body.truncate and prompt_tokens > (limit := prompt_limit(body.num_ctx)):
        return _rejection(f"the prompt is {prompt_tokens} tokens; a context of {body.num_ctx} holds {limit}",
                          "context_exceeded", prompt_tokens=prompt_tokens, limit=limit)
    try:
        if body.grammar is not None:
            body.grammar.check()
        grammar = None if body.grammar is None else host.grammars.compile(body.grammar)
    except GrammarRefused as exc:
        return _refusal(exc)
    running = Running(host, body, keys, images, grammar)
    if grammar is not None:
        try:
            await asyncio.wrap_future(grammar)
        except BaseException as exc:
            await running.cancel()
            if isinstance(exc, GrammarRefused):
                return _refusal(exc)
            raise
    return Stream(running.lines(), media_type="application/x-ndjson")


def _refusal(exc: GrammarRefused) -> Response[Any]:
    """A format the runner cannot enforce: a client error, answered before any output."""
    return _rejection(str(exc), "grammar_refused")


def _rejection(message: str, kind: str, **details: Any) -> Response[Any]:
    return Response({"error": message, "kind": kind} | details, status_code=400)


def _error(request: Request, exc: Exception) -> Response[Any]:
    log.exception("%s failed", request.url.path)
    return Response({"error": str(exc) or type(exc).__name__}, status_code=getattr(exc, "status_code", 500))


def _exit_with_the_daemon(interval: float = 1.0) -> None:
    """End this process soon after the daemon that started it ends, however it ends (SIGKILL and crashes
    included): a runner left behind would hold its model's memory with nobody to talk to. A group's ranks are
    the launcher's children, so those on the daemon's machine watch the daemon by the pid it gives them; one on
    another host watches its ssh session, and the ring, which breaks when the leader goes."""
    given = os.environ.get(DAEMON_PID_VARIABLE)
    daemon = int(given) if given else os.getppid()
    alive = (lambda: _exists(daemon)) if given else (lambda: os.getppid() == daemon)

    def watch() -> None:
        while alive():
            time.sleep(interval)
        log.warning("the daemon (pid %d) is gone; exiting", daemon)
        os._exit(1)  # at once: the MLX thread may be in the middle of a step

    threading.Thread(target=watch, name="plugd-daemon-watch", daemon=True).start()


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process now holds the number; ours is gone
        return False
    return True


def main(model_dir: str, socket_path: str, config_json: str) -> int:
    config = RunnerConfig.from_json(config_json)
    logging.basicConfig(level=config.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s runner[%(process)d]: %(message)s")
    _exit_with_the_daemon()
    group = None if config.group is None else Group.joined()
    try:
        host = ModelHost(_local_model_dir(Path(model_dir), config), config, group)
    except Exception as exc:  # the daemon reads this last line as the load error
        print(f"{CHECKPOINT_REFUSED if isinstance(exc, CheckpointError) else FAILURE}{exc}", file=sys.stderr,
              flush=True)
        return 1
    if group is not None and not group.leads:
        return host.follow()
    app = Litestar(
        route_handlers=[status, completion, embed],
        state=State({"host": host}),
        exception_handlers={Exception: _error},
        logging_config=None,
    )
    server = uvicorn.Server(uvicorn.Config(app, uds=socket_path, log_config=None, access_log=False))
    host.stop = lambda: setattr(server, "should_exit", True)
    if group is not None:
        server.handle_exit = _group_stopped
    server.run()
    return 0


def _group_stopped(signum: int, frame: Any) -> None:
    """The launcher ends the group, when a rank dies (or it is stopped), with SIGTERM: at once, not after the
    streams under way, which the lost rank may leave waiting at a collective for ever."""
    print(f"{FAILURE}the runner group stopped: one of its ranks is gone", file=sys.stderr, flush=True)
    os._exit(1)


def _local_model_dir(model_dir: Path, config: RunnerConfig) -> Path:
    """`model_dir`, or for a rank on a host without it, a folder of links into this host's copy of the store."""
    if model_dir.is_dir() or config.group is None:
        return model_dir
    local = Path(tempfile.mkdtemp(prefix="plugd-rank-")) / "model"
    for name, blob in config.group.files.items():
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).symlink_to(blob)
    return local
