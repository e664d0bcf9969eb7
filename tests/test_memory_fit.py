"""The memory fit through a live daemon with real runners: what a loaded model's caches have yet to fill is not
counted as free for the next model.

A fit plugin stands in for a machine with 48 MiB free besides what the loaded runners hold (the built-in
system-memory fit's rule, available + held). The first model's live caches are estimated at 2 MiB for a
4,096-token context and 33 MiB for 65,536 tokens, and take that memory only as its positions fill (they grow
with use); the prompt cache fills its budget only over many requests. The second model needs 36 MiB.
"""

from __future__ import annotations

import os

import httpx
import ollama
import pytest

from plugd.scheduler import memory
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.plugins import write_distribution
from plugd.testing.server import LiveServer

pytestmark = pytest.mark.skipif(memory.resident_bytes(os.getpid()) is None,
                                reason="needs a platform that reports a process's resident memory")

FIXED_FREE = """
    import os
    from plugd.hookspecs import MemoryFit, hookimpl

    @hookimpl
    def plugd_memory_fits():
        return [MemoryFit(name="fixed-free", budget=lambda held: int(os.environ["TEST_FREE"]) + held)]
"""
OPTIONS = {"num_predict": 2, "temperature": 0}
WIDE = {"hidden_size": 512, "intermediate_size": 1024, "head_dim": 128}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("memory-fit")
    return {"first": write_checkpoint(root / "first", "qwen3", overrides={"max_position_embeddings": 65536}),
            "second": write_checkpoint(root / "second", "qwen3", seed=1, overrides=WIDE)}


@pytest.fixture
def start(plugd_server_factory, checkpoints, tmp_path):
    site = write_distribution(tmp_path / "site", "fixed-free", {"fixed_free": FIXED_FREE}, {"fixed-free": "fixed_free"})

    def started(env: dict[str, str]) -> tuple[LiveServer, ollama.Client]:
        # One request per runner: the caches these fits count are those of one sequence.
        server = plugd_server_factory(env={"PYTHONPATH": str(site), "TEST_FREE": str(48 << 20), "PLUGD_NUM_PARALLEL": "1"}
                                      | env)
        client = ollama.Client(host=server.url)
        for name, checkpoint in checkpoints.items():
            client.create(model=name, files={p.name: client.create_blob(p) for p in sorted(checkpoint.iterdir())})
        return server, client

    return started


def loaded_after_the_second(client: ollama.Client) -> list[str]:
    client.generate(model="second", prompt="Hi", options=OPTIONS)
    return sorted(m.model.removesuffix(":latest") for m in client.ps().models)


@pytest.mark.parametrize("num_ctx, both", [(4096, True), (65536, False)])
def test_a_preloaded_models_caches_are_not_free_for_the_next(start, num_ctx, both):
    _, client = start({"PLUGD_CACHE_POLICY": "single-slot"})
    client.generate(model="first", options={"num_ctx": num_ctx})  # no prompt: load only, as clients preload
    assert loaded_after_the_second(client) == (["first", "second"] if both else ["second"])


@pytest.mark.parametrize("cache_bytes, both", [(2 << 20, True), (24 << 20, False)])
def test_the_prompt_caches_unfilled_budget_is_not_free_for_the_next(start, cache_bytes, both):
    # A 4,096-token context, as the first test's small one: sized to memory, it would take the room this tests.
    server, client = start({"PLUGD_PREFIX_CACHE_BYTES": str(cache_bytes), "PLUGD_CONTEXT_LENGTH": "4096"})
    client.generate(model="first", prompt="Hi", options=OPTIONS)
    assert httpx.get(f"{server.url}/api/ps").json()["models"][0]["prompt_cache"]["budget"] == cache_bytes
    assert loaded_after_the_second(client) == (["first", "second"] if both else ["second"])
