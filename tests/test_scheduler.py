"""The scheduler on its own: queueing, eviction, keep-alive and memory fit, with stand-in runners that load at once
(or when a test lets them), so that every case runs in milliseconds. Real runner processes under the scheduler are
tested end to end elsewhere (test_generate, test_memory_fit, test_wedged_runner, ...)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from plugd.chat.models import ResolvedModel
from plugd.hookspecs import Architecture, CachePolicy, MemoryFit, ModelFiles
from plugd.plugins import Registry
from plugd.protocol import RunnerConfig
from plugd.scheduler import memory
from plugd.scheduler.memory import InsufficientMemory
from plugd.scheduler.runner_client import UnloadableModel
from plugd.scheduler.scheduler import QueueFull, Scheduler
from plugd.settings import Settings
from plugd.store.names import ModelName

MiB = 2**20
BOUND = 250 * MiB  # what the memory fit allows all loaded models together
CONTEXT = 256
CONFIG = {"num_hidden_layers": 1, "num_attention_heads": 1, "head_dim": 1}  # caches of a few KiB


def model(name: str, weights: int = 100 * MiB) -> ResolvedModel:
    return ResolvedModel(
        name=ModelName.parse(name), digest=f"sha256:{name}", files={}, config={},
        model_files=ModelFiles(config=CONFIG), generation_config={},
        architecture=Architecture("fake", "nowhere"), tensors={"w": {"shape": [weights], "dtype": "U8"}},
        parameters={}, system=None, messages=[])


class FakeRunner:
    """Loads when `loaded` is set (at once unless a test clears it first), or fails with `refusal`."""

    def __init__(self, model: ResolvedModel, config: RunnerConfig):
        self.model, self.config = model, config
        self.closing = False
        self.started = False
        self.loaded = asyncio.Event()
        self.loaded.set()
        self.refusal: Exception | None = None
        self.ended = asyncio.Event()

    @property
    def alive(self) -> bool:
        return self.started and not self.ended.is_set() and not self.closing

    async def start(self) -> None:
        await self.loaded.wait()
        if self.refusal is not None:
            raise self.refusal
        self.started = True

    async def close(self) -> None:
        self.closing = True
        self.ended.set()

    async def wait(self) -> int:
        await self.ended.wait()
        return 0 if self.closing else -9

    def failure(self) -> str:
        return "model runner was killed by signal 9"

    def resident_bytes(self) -> int | None:
        return None

    async def status(self) -> dict[str, Any]:
        return {}

    def die(self) -> None:
        self.ended.set()


class Runners:
    """The factory the scheduler is given; every runner it made, in order, and a hook to adjust each one."""

    def __init__(self):
        self.made: list[FakeRunner] = []
        self.prepare = lambda runner: None

    def __call__(self, model: ResolvedModel, config: RunnerConfig) -> FakeRunner:
        runner = FakeRunner(model, config)
        self.prepare(runner)
        self.made.append(runner)
        return runner

    def of(self, name: str) -> list[FakeRunner]:
        return [r for r in self.made if r.model.name == ModelName.parse(name)]


@pytest.fixture
def runners() -> Runners:
    return Runners()


def scheduler(runners: Runners, bound: int | None = BOUND, **settings) -> Scheduler:
    """A scheduler over fake runners; one request per runner at a time unless `num_parallel` says otherwise."""
    settings.setdefault("num_parallel", 1)
    fits = [] if bound is None else [MemoryFit("fixed", lambda held: bound)]
    registry = Registry(plugins=[], items={"plugd_memory_fits": fits,
                                           "plugd_cache_policies": [CachePolicy("single-slot", "nowhere:none")]})
    return Scheduler(registry, Settings(**settings), runner_factory=runners)


async def use(s: Scheduler, m: ResolvedModel, keep_alive: float = 300.0) -> None:
    async with s.acquire(m, CONTEXT, keep_alive):
        pass


async def holding(s: Scheduler, m: ResolvedModel, entered: asyncio.Event, leave: asyncio.Event,
                  keep_alive: float = 300.0) -> None:
    async with s.acquire(m, CONTEXT, keep_alive):
        entered.set()
        await leave.wait()


def test_a_loaded_model_is_reused_and_with_one_slot_serves_one_request_at_a_time(runners):
    async def scenario():
        s = scheduler(runners, num_parallel=1)
        entered, leave = asyncio.Event(), asyncio.Event()
        first = asyncio.create_task(holding(s, model("a"), entered, leave))
        await entered.wait()
        assert s.must_wait("sha256:a", CONTEXT) and not s.must_wait("sha256:b", CONTEXT)
        second = asyncio.create_task(use(s, model("a")))
        await asyncio.sleep(0)
        assert not second.done()  # waits for the slot
        leave.set()
        await asyncio.gather(first, second)
        assert len(runners.made) == 1 and not s.must_wait("sha256:a", CONTEXT)
        assert runners.made[0].config.num_parallel == 1

    asyncio.run(scenario())


def test_requests_up_to_the_parallel_slots_hold_one_runner_together(runners):
    async def scenario():
        s = scheduler(runners, num_parallel=2)
        leave = asyncio.Event()
        entered = [asyncio.Event(), asyncio.Event()]
        holders = [asyncio.create_task(holding(s, model("a"), event, leave)) for event in entered]
        await asyncio.gather(*(event.wait() for event in entered))
        assert s.must_wait("sha256:a", CONTEXT)
        third = asyncio.create_task(use(s, model("a")))
        await asyncio.sleep(0)
        assert not third.done()
        leave.set()
        await asyncio.gather(*holders, third)
        assert len(runners.made) == 1 and runners.made[0].config.num_parallel == 2

    asyncio.run(scenario())


def test_the_default_parallel_slots_are_what_memory_allows(runners):
    caches = memory.CacheEstimate.of(model("a").architecture, CONFIG, memory.guessed_float_bytes())
    one, two = caches.bytes(CONTEXT), caches.bytes(CONTEXT, 2)
    assert two > 2 * one  # two decode beside the policy's live caches
    roomy = scheduler(runners, num_parallel=None)
    tight = scheduler(Runners(), bound=100 * MiB + (one + two) // 2, num_parallel=None)

    async def loaded(s: Scheduler) -> int:
        await use(s, model("a"))
        return s.loaded["sha256:a"].parallel

    assert asyncio.run(loaded(roomy)) == memory.DEFAULT_PARALLEL
    assert asyncio.run(loaded(tight)) == 1


def test_requests_beyond_the_queue_limit_are_refused(runners):
    async def scenario():
        s = scheduler(runners, max_queue=2)
        entered, leave = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(holding(s, model("a"), entered, leave))
        await entered.wait()
        waiting = [asyncio.create_task(use(s, model("a"))) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(QueueFull, match="2 requests are already waiting"):
            await use(s, model("a"))
        leave.set()
        await asyncio.gather(holder, *waiting)
        await use(s, model("a"))  # the queue drained: accepted again

    asyncio.run(scenario())


def test_the_least_recently_used_idle_model_is_evicted_first(runners):
    async def scenario():
        s = scheduler(runners)
        for name in ("a", "b", "a"):  # b is now the one used longest ago
            await use(s, model(name))
        await use(s, model("c"))  # 3 x 100 MiB does not fit in 250
        assert runners.of("b")[0].closing and not runners.of("a")[0].closing
        assert set(s.loaded) == {"sha256:a", "sha256:c"}

    asyncio.run(scenario())


def test_a_load_that_does_not_fit_waits_for_a_busy_model_then_evicts_it(runners):
    async def scenario():
        s = scheduler(runners)
        entered, leave = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(holding(s, model("a", 200 * MiB), entered, leave))
        await entered.wait()
        other = asyncio.create_task(use(s, model("b")))
        await asyncio.sleep(0.01)
        assert not other.done() and not runners.of("b")  # a busy model is never evicted
        leave.set()
        await asyncio.gather(holder, other)
        assert runners.of("a")[0].closing and set(s.loaded) == {"sha256:b"}

    asyncio.run(scenario())


def test_a_model_that_fits_nowhere_is_refused_without_evicting_anything(runners):
    async def scenario():
        s = scheduler(runners)
        await use(s, model("a"))
        with pytest.raises(InsufficientMemory, match="model 'b:latest' needs 300.0 MiB"):
            await use(s, model("b", 300 * MiB))
        return s

    s = asyncio.run(scenario())
    assert len(runners.made) == 1  # the idle model stays: unloading it would not have made room enough
    assert not runners.of("a")[0].closing and set(s.loaded) == {"sha256:a"}


def test_keep_alive_unloads_when_it_expires_and_zero_unloads_at_once(runners):
    async def scenario():
        s = scheduler(runners, bound=None)
        await use(s, model("a"), keep_alive=0)
        assert runners.of("a")[0].closing and not s.loaded
        await use(s, model("b"), keep_alive=0.05)
        assert not runners.of("b")[0].closing and s.loaded["sha256:b"].expires_at < math.inf
        await asyncio.wait_for(runners.of("b")[0].ended.wait(), 5)
        assert not s.loaded
        await use(s, model("c"), keep_alive=math.inf)
        await asyncio.sleep(0.1)
        assert s.loaded["sha256:c"].expires_at == math.inf and not runners.of("c")[0].closing

    asyncio.run(scenario())


def test_a_request_in_use_cancels_the_expiry(runners):
    async def scenario():
        s = scheduler(runners, bound=None)
        await use(s, model("a"), keep_alive=0.05)
        entered, leave = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(holding(s, model("a"), entered, leave, keep_alive=300))
        await entered.wait()
        await asyncio.sleep(0.1)  # past the first request's keep_alive
        assert not runners.of("a")[0].closing
        leave.set()
        await holder

    asyncio.run(scenario())


def test_a_slow_load_holds_up_no_request_for_a_model_already_loaded(runners):
    async def scenario():
        s = scheduler(runners, bound=None)
        await use(s, model("a"))
        runners.prepare = lambda runner: runner.loaded.clear()
        slow = asyncio.create_task(use(s, model("b")))
        await asyncio.sleep(0.01)
        assert s.must_wait("sha256:c", CONTEXT)  # a third model's load would queue behind b's
        await asyncio.wait_for(use(s, model("a")), 5)
        assert not slow.done()
        runners.of("b")[0].loaded.set()
        await slow

    asyncio.run(scenario())


def test_a_load_that_fails_leaves_nothing_loaded_and_the_next_request_tries_again(runners):
    async def scenario():
        s = scheduler(runners, bound=None)

        def refuse(runner):
            runner.refusal = UnloadableModel("tensors of a kind plugd cannot run")

        runners.prepare = refuse
        with pytest.raises(UnloadableModel):
            await use(s, model("a"))
        assert not s.loaded and s.waiting == 0 and runners.made[0].closing
        runners.prepare = lambda runner: None
        await use(s, model("a"))
        assert len(runners.made) == 2 and "sha256:a" in s.loaded

    asyncio.run(scenario())


def test_a_runner_that_dies_is_forgotten_and_the_model_loads_again(runners):
    async def scenario():
        s = scheduler(runners, bound=None)
        await use(s, model("a"))
        runners.made[0].die()
        for _ in range(100):
            if not s.loaded:
                break
            await asyncio.sleep(0.01)
        assert not s.loaded
        await use(s, model("a"))
        assert len(runners.made) == 2 and s.loaded["sha256:a"].runner is runners.made[1]

    asyncio.run(scenario())


def test_max_loaded_models_evicts_even_when_memory_fits(runners):
    async def scenario():
        s = scheduler(runners, bound=None, max_loaded_models=1)
        await use(s, model("a"))
        await use(s, model("b"))
        assert runners.of("a")[0].closing and set(s.loaded) == {"sha256:b"}

    asyncio.run(scenario())
