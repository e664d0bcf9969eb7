"""Which models are loaded: acquire and release per request, keep_alive, eviction, memory fit, the queue."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio
import httpx
from attrs import define, field

from plugd.cache_policies import chosen_policy
from plugd.chat.models import ResolvedDraft, ResolvedModel, embedding_layout
from plugd.errors import PlugdError
from plugd.plugins import Registry
from plugd.protocol import GroupLayout, RunnerConfig
from plugd.scheduler import memory
from plugd.scheduler.rank_share import RankShare, rank_share
from plugd.scheduler.runner_client import RunnerError, RunnerProcess
from plugd.settings import Settings

log = logging.getLogger(__name__)


class QueueFull(PlugdError, RuntimeError):
    status = 503

    def __init__(self, limit: int):
        super().__init__(f"server busy: {limit} requests are already waiting; try again later")


class Runner(Protocol):
    """What the scheduler (and the pipeline, of the runner it acquires) asks of a model's runner: RunnerProcess, or
    a stand-in where a test needs no process."""

    closing: bool  # set once close() has begun: the runner's end is the scheduler's doing, not a crash

    @property
    def alive(self) -> bool: ...

    async def start(self) -> None:
        """Load the model; UnloadableModel or RunnerError when it cannot."""

    async def close(self) -> None:
        """Stop the runner; its memory is back when this returns."""

    async def wait(self) -> int:
        """Return when the runner has ended, by close() or on its own."""

    def failure(self) -> str:
        """Why a runner that ended on its own did."""

    def resident_bytes(self) -> int | None:
        """The memory only ending the runner gives back, where the platform says; None elsewhere."""

    async def status(self) -> dict[str, Any]: ...

    async def post(self, path: str, body: dict[str, Any]) -> Any: ...

    def completion(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]: ...


RunnerFactory = Callable[[ResolvedModel, RunnerConfig], Runner]


def runner_processes(settings: Settings) -> RunnerFactory:
    """Runner processes for models, with the settings' timeouts."""
    return lambda model, config: RunnerProcess(model.files, config, settings.load_timeout, settings.runner_timeout)


@define(eq=False)
class Loaded:
    model: ResolvedModel
    runner: Runner
    num_ctx: int
    size: int  # weights and caches, estimated for num_ctx
    sized: bool = False  # num_ctx is the scheduler's default (requests without num_ctx use it), not a request's
    cache_budget: int = 0  # what the cache policy may keep beyond the live caches
    growth: int = 0  # what its caches may add once it is ready: the live caches for num_ctx and cache_budget
    resident_at_ready: int | None = None  # its runner's resident bytes when loading finished, where measurable
    active: int = 0
    keep_alive: float = 300.0
    unload_requested: bool = False
    expires_at: float = math.inf  # time.time() when it unloads; inf while in use or kept for ever
    last_used: float = field(factory=time.monotonic)
    expiry: asyncio.TimerHandle | None = None
    parallel: int = 1  # the requests its runner decodes together
    slots: asyncio.Semaphore = field(default=None)

    def __attrs_post_init__(self) -> None:
        self.slots = asyncio.Semaphore(self.parallel)


class Scheduler:
    def __init__(self, registry: Registry, settings: Settings, runner_factory: RunnerFactory | None = None):
        self.registry = registry
        self.settings = settings
        self.runner_factory = runner_factory or runner_processes(settings)
        self.cache_policy = chosen_policy(registry.named("plugd_cache_policies"), settings.cache_policy)
        self.max_loaded = settings.max_loaded_models
        self.device_limit: int | None = None  # the GPU's working set, once a runner has reported it
        self.float_bytes = memory.guessed_float_bytes()  # the runners' compute dtype, as the first one reports it
        self.device_known = False  # whether a runner has reported both
        self.max_queue = settings.max_queue
        self.loaded: dict[str, Loaded] = {}  # by manifest digest
        self.waiting = 0
        self.changed = asyncio.Condition()  # guards `loaded` and each entry's counters
        self.loading = asyncio.Lock()

    def _memory(self) -> tuple[int, int]:
        """(held, claimed): the bytes the loaded runners hold now, and those plus what their caches may still add.

        Estimates alone would count a model's unfilled caches twice, in its estimate and in the memory still
        free, so a second model could load into memory the first one's caches will need. Where the platform
        reports a runner's resident memory, that is what it holds, and its caches may still add their estimate
        less what it has grown by since it was ready."""
        claims = [self._claim(entry) for entry in self.loaded.values()]
        return sum(held for held, _ in claims), sum(claimed for _, claimed in claims)

    @staticmethod
    def _claim(entry: Loaded) -> tuple[int, int]:
        """(held, claimed) of one loaded model, as `_memory` counts them."""
        resident = entry.runner.resident_bytes() if entry.resident_at_ready is not None else None
        if resident is None:
            return entry.size + entry.cache_budget, entry.size + entry.cache_budget
        return resident, resident + max(0, entry.growth - (resident - entry.resident_at_ready))

    def _default_context(self, model: ResolvedModel, weights: int) -> int:
        """The context of a load for requests without num_ctx: the model's maximum, lowered to what its caches fit
        in the memory the fits leave after its weights, the cache policy's budget and the models busy now (idle
        ones count as free: they are evicted if the load needs their memory)."""
        maximum = model.config.get("context_length")
        held, _ = self._memory()
        bound = memory.budget(self.registry, held, self.device_limit)
        caches = self._caches(model)
        if bound is None:
            return memory.default_context(caches, math.inf, maximum)
        busy = sum(self._claim(entry)[1] for entry in self.loaded.values() if entry.active > 0)
        policy = self.cache_policy.budget() if self.cache_policy.budget is not None else 0
        context = memory.default_context(caches, bound - busy - weights - policy, maximum)
        log.info("%s gets a context of %d tokens (its maximum: %s) in the %.1f MiB left after its weights",
                 model.name, context, maximum, max(0, bound - busy - weights) / 2**20)
        return context

    @asynccontextmanager
    async def acquire(self, model: ResolvedModel, num_ctx: int | None, keep_alive: float) -> AsyncIterator[Loaded]:
        """A loaded runner for `model`, to this request alone until the block ends; then keep_alive decides.

        `num_ctx` None asks for the model's default context (`_default_context`), sized when the model loads and
        the same for every such request while it stays loaded; the entry's `num_ctx` says which it is.

        Up to the entry's `parallel` requests hold its runner at once (they decode together); those waiting for a
        load or for one of its slots count against PLUGD_MAX_QUEUE.
        """
        if self.waiting >= self.max_queue:
            raise QueueFull(self.max_queue)
        self.waiting += 1
        entry = None
        try:
            entry = await self._ready(model, num_ctx)
            await entry.slots.acquire()
        except BaseException:
            if entry is not None:
                await self._shielded_release(entry, keep_alive)
            raise
        finally:
            self.waiting -= 1
        try:
            yield entry
        finally:
            entry.slots.release()
            await self._shielded_release(entry, keep_alive)

    def must_wait(self, digest: str, num_ctx: int | None) -> bool:
        """Whether a request for the model would wait now: its runner busy with another request, or a load under way
        that comes first. (A load that waits for busy models to free memory is not foreseen.)"""
        entry = self.loaded.get(digest)
        if entry is None or not entry.runner.alive:
            return self.loading.locked()
        return entry.slots.locked() if self._usable(digest, num_ctx) else entry.active > 0

    async def _shielded_release(self, entry: Loaded, keep_alive: float) -> None:
        """`_release`, carried through even when the request is being cancelled (its client gone): an unload it
        starts must finish, and the waiters must hear of it."""
        with anyio.CancelScope(shield=True):
            await self._release(entry, keep_alive)

    def _usable(self, digest: str, num_ctx: int | None) -> Loaded | None:
        entry = self.loaded.get(digest)
        if not entry or not entry.runner.alive:
            return None
        return entry if (entry.sized if num_ctx is None else entry.num_ctx == num_ctx) else None

    async def _ready(self, model: ResolvedModel, num_ctx: int | None) -> Loaded:
        """The model's loaded runner, held for the caller; loads it (making room first) when needed."""
        model.require_architecture()  # refused before anything is evicted for it
        weights = self._share(model).weights
        if (draft := self._draft(model)) is not None:
            weights += memory.weight_bytes(draft.tensors, self.float_bytes)
        async with self.changed:
            if entry := self._usable(model.digest, num_ctx):
                self._hold(entry)
                return entry
        # One load at a time, so that each fit check sees the memory the previous load took. Requests for
        # models already loaded do not wait for it.
        async with self.loading:
            async with self.changed:
                while not (entry := self._usable(model.digest, num_ctx)):
                    stale = self.loaded.get(model.digest)
                    if stale and stale.active == 0:
                        await self._unload(stale)  # dead, or loaded with another context length
                        continue
                    if stale is None:
                        context = num_ctx or self._default_context(model, weights)
                        parallel = self._parallel(model, context, weights)
                        caches = self._caches(model).bytes(context, parallel)
                        needed = weights + caches
                        if await self._make_room(model, needed):
                            break
                    await self.changed.wait()
                if entry:
                    self._hold(entry)
                    return entry
                cache_budget = self._cache_budget(needed)
            engines = {engine.name: engine.factory for engine in self.registry.items.get("plugd_grammar_engines", [])}
            if model.draft is not None and model.draft.architecture is None:
                log.warning("no installed architecture plugin runs the draft of %s (model_type %r): it loads without",
                            model.name, model.draft.config.get("model_type"))
            config = RunnerConfig(model.require_architecture().module, self.cache_policy.factory, cache_budget,
                                  engines, self.settings.log_level, embedding_layout(model), parallel,
                                  self._group(model), draft.architecture.module if draft is not None else None)
            entry = Loaded(model=model, runner=self.runner_factory(model, config), num_ctx=context,
                           size=needed, sized=num_ctx is None, cache_budget=cache_budget or 0, parallel=parallel,
                           growth=caches + (cache_budget or 0))
            try:
                await entry.runner.start()
            except BaseException:
                await entry.runner.close()
                raise
            entry.resident_at_ready = entry.runner.resident_bytes()
            await self._learn_device(entry.runner)
            async with self.changed:
                self.loaded[model.digest] = entry
                self._hold(entry)
            asyncio.get_running_loop().create_task(self._watch(entry))
            return entry

    def _group(self, model: ResolvedModel) -> GroupLayout | None:
        """The ranks that serve `model`: PLUGD_HOSTFILE's for a generative model (an embedding model is small,
        and runs in one process)."""
        hosts = self.settings.hosts
        return None if hosts is None or embedding_layout(model) is not None else hosts.layout(model.files)

    def _share(self, model: ResolvedModel) -> RankShare:
        """What this machine holds of `model`: all of it, or in a group rank 0's part, which the memory fits count."""
        group = self._group(model)
        if group is None:
            return RankShare(memory.weight_bytes(model.tensors, self.float_bytes), 1.0)
        return rank_share(model.tensors, self.float_bytes, group.ranks, group.split,
                          model.require_architecture().drafter_tensors)

    def _parallel(self, model: ResolvedModel, context: int, weights: int) -> int:
        """The requests the model's runner decodes together: PLUGD_NUM_PARALLEL (or OLLAMA_NUM_PARALLEL); else
        as many as DEFAULT_PARALLEL whose caches at `context` fit in the memory left beside the models busy now,
        and one where they do not (an embedding model: one, its requests are batched within)."""
        if self.settings.num_parallel is not None:
            return self.settings.num_parallel
        if embedding_layout(model) is not None:
            return 1
        held, _ = self._memory()
        bound = memory.budget(self.registry, held, self.device_limit)
        if bound is None:
            return memory.DEFAULT_PARALLEL
        busy = sum(self._claim(entry)[1] for entry in self.loaded.values() if entry.active > 0)
        policy = self.cache_policy.budget() if self.cache_policy.budget is not None else 0
        caches = self._caches(model)
        room = bound - busy - weights - policy
        return next((n for n in range(memory.DEFAULT_PARALLEL, 1, -1) if caches.bytes(context, n) <= room), 1)

    def _caches(self, model: ResolvedModel) -> memory.CacheEstimate:
        caches = memory.CacheEstimate.of(model.require_architecture(), model.model_files.config, self.float_bytes,
                                         self._share(model).caches)
        if (draft := self._draft(model)) is not None:
            caches = caches.with_draft(draft.architecture.cache_layers(draft.config.get("text_config", draft.config)))
        return caches

    def _draft(self, model: ResolvedModel) -> ResolvedDraft | None:
        """The model's draft where its runner loads one: where an installed architecture runs it (not one whose
        plugin was uninstalled since the model was created), and not in a group, which decodes without drafting."""
        if model.draft is None or model.draft.architecture is None or self._group(model) is not None:
            return None
        return model.draft

    async def _learn_device(self, runner: Runner) -> None:
        """From the first runner that answers (the daemon imports no MLX): its compute dtype, which the estimates
        count floats at, and the GPU's bound on what all models hold, which later loads fit under, evicting idle
        models as the memory fits do."""
        if self.device_known:
            return
        try:
            status = await runner.status()
        except (RunnerError, httpx.HTTPError, ValueError):
            return
        self.device_known = True
        self.float_bytes = status.get("float_bytes", self.float_bytes)
        self.device_limit = status.get("working_set_bytes")
        if self.device_limit is not None:
            log.info("the GPU's working set bounds loaded models to %.1f MiB", self.device_limit / 2**20)

    async def _make_room(self, model: ResolvedModel, needed: int) -> bool:
        """Evict idle models until `needed` fits; False to wait for busy ones; InsufficientMemory if it never fits."""
        while True:
            idle = sorted((e for e in self.loaded.values() if e.active == 0), key=lambda e: e.last_used)
            held, claimed = self._memory()
            bound = memory.budget(self.registry, held, self.device_limit)
            if bound is not None and needed > bound:  # the bounds count what loaded models hold: never fits
                raise memory.InsufficientMemory(str(model.name), needed, bound)
            fits = bound is None or needed + claimed <= bound
            if fits and len(self.loaded) < self.max_loaded:
                return True
            if idle:
                log.info("unloading %s to make room for %s", idle[0].model.name, model.name)
                await self._unload(idle[0])
                continue
            return False

    def _cache_budget(self, needed: int) -> int | None:
        """The bytes the cache policy may keep beyond the live caches of a load needing `needed`: its own budget,
        lowered to what the memory fits leave (a model that fits is never refused or evicted for its cache).
        None for a policy that keeps nothing beyond them."""
        if self.cache_policy.budget is None:
            return None
        wanted = self.cache_policy.budget()
        held, claimed = self._memory()
        bound = memory.budget(self.registry, held, self.device_limit)
        if bound is None:
            return wanted
        room = max(0, bound - claimed - needed)
        if room < wanted:
            log.info("cache policy %s gets %.1f of its %.1f MiB: what the memory fits leave", self.cache_policy.name,
                     room / 2**20, wanted / 2**20)
        return min(wanted, room)

    def _hold(self, entry: Loaded) -> None:
        entry.active += 1
        entry.expires_at = math.inf
        if entry.expiry:
            entry.expiry.cancel()
            entry.expiry = None

    async def _release(self, entry: Loaded, keep_alive: float) -> None:
        async with self.changed:
            entry.active -= 1
            entry.last_used = time.monotonic()
            entry.keep_alive = keep_alive
            if entry.active == 0 and self.loaded.get(entry.model.digest) is entry:
                if keep_alive <= 0 or entry.unload_requested:
                    await self._unload(entry)
                elif keep_alive < math.inf:
                    entry.expires_at = time.time() + keep_alive
                    entry.expiry = asyncio.get_running_loop().call_later(
                        keep_alive, lambda: asyncio.ensure_future(self._expire(entry))
                    )
            self.changed.notify_all()

    async def _expire(self, entry: Loaded) -> None:
        async with self.changed:
            if entry.active == 0 and self.loaded.get(entry.model.digest) is entry:
                log.info("keep_alive expired for %s", entry.model.name)
                await self._unload(entry)
                self.changed.notify_all()

    async def _unload(self, entry: Loaded) -> None:
        if self.loaded.get(entry.model.digest) is entry:
            del self.loaded[entry.model.digest]
        if entry.expiry:
            entry.expiry.cancel()
        await entry.runner.close()

    async def _watch(self, entry: Loaded) -> None:
        """Notice a runner that dies on its own: forget it, so the next request loads the model again."""
        await entry.runner.wait()
        if entry.runner.closing:
            return
        log.error("runner for %s died (%s)", entry.model.name, entry.runner.failure())
        async with self.changed:
            if self.loaded.get(entry.model.digest) is entry:
                del self.loaded[entry.model.digest]
            await entry.runner.close()
            self.changed.notify_all()

    async def unload(self, digest: str) -> bool:
        """Unload now if idle, or as soon as its requests finish (keep_alive 0). False when not loaded."""
        async with self.changed:
            entry = self.loaded.get(digest)
            if entry is None:
                return False
            if entry.active:
                entry.unload_requested = True
            else:
                await self._unload(entry)
                self.changed.notify_all()
            return True

    async def shutdown(self) -> None:
        async with self.changed:
            for entry in list(self.loaded.values()):
                await self._unload(entry)
