"""A request without num_ctx gets the model's default context: its maximum when memory allows, lowered to what its
caches fit in the memory left after its weights and prompt cache, never under 4,096 tokens; the same for every
dialect and stable while the model stays loaded. An explicit num_ctx (request, Modelfile, PLUGD_CONTEXT_LENGTH)
still wins.

The live tests' fit plugin stands in for a machine whose free memory (besides what the runners hold) is what a
file says, so one daemon sees a roomy machine, then a short one. The tiny model's trained maximum is raised to
131,072 positions, whose caches (2 layers x 2 kv heads x 16 dims, keys and values in float32: 512 bytes a
position) take 66 MiB.
"""

from __future__ import annotations

import anthropic
import httpx
import ollama
import openai
import pytest

from plugd.constants import CACHE_STEP
from plugd.hookspecs import Architecture
from plugd.scheduler import memory
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.plugins import write_distribution

MAXIMUM = 131072
PROMPT_CACHE = 4 << 20
FILE_FREE = """
    import os
    from pathlib import Path
    from plugd.hookspecs import MemoryFit, hookimpl

    @hookimpl
    def plugd_memory_fits():
        return [MemoryFit(name="file-free", budget=lambda held: int(Path(os.environ["TEST_FREE"]).read_text()) + held)]
"""
LONG = " ".join(f"word{i}" for i in range(1000))  # over 4,096 tokens of the tiny vocabulary
QWEN3 = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 0}


def caches(config: dict) -> memory.CacheEstimate:
    """As the daemon estimates the caches of a model of an attention-only architecture, on CPU (float32)."""
    return memory.CacheEstimate.of(Architecture("qwen3", "plugd_qwen.qwen3"), config, float_bytes=4)


# Daemon-side sizing, from config.json alone.

def test_the_maximum_when_it_fits_the_floor_when_nothing_does_and_the_floor_without_a_maximum():
    assert memory.default_context(caches(QWEN3), float("inf"), MAXIMUM) == MAXIMUM
    assert memory.default_context(caches(QWEN3), 0, MAXIMUM) == memory.CONTEXT_FLOOR == 4096
    assert memory.default_context(caches(QWEN3), 0, 2048) == 2048  # a model trained shorter than the floor: its maximum
    assert memory.default_context(caches(QWEN3), float("inf"), None) == 4096


def test_the_largest_context_whose_caches_fit_in_whole_steps():
    room = 20 << 20
    context = memory.default_context(caches(QWEN3), room, MAXIMUM)
    assert context % CACHE_STEP == 0 and 4096 < context < MAXIMUM
    assert caches(QWEN3).bytes(context) <= room < caches(QWEN3).bytes(context + CACHE_STEP)


def test_sliding_layers_cost_what_they_keep_not_the_context():
    full = QWEN3 | {"num_hidden_layers": 6}
    # transformers' layer_types: 5 of the 6 layers keep 1,024 positions
    sliding = full | {"sliding_window": 1024, "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}
    room = 40 << 20
    assert memory.default_context(caches(full), room, MAXIMUM) < memory.default_context(caches(sliding), room, MAXIMUM)


# Through a live daemon.

@pytest.fixture(scope="module")
def free_file(tmp_path_factory):
    return tmp_path_factory.mktemp("free") / "free"


@pytest.fixture(scope="module")
def server(modelfile_server, tmp_path_factory, free_file):
    root = tmp_path_factory.mktemp("default-context")
    checkpoint = write_checkpoint(root / "long", "qwen3", overrides={"max_position_embeddings": MAXIMUM})
    site = write_distribution(root / "site", "file-free", {"file_free": FILE_FREE}, {"file-free": "file_free"})
    free_file.write_text(str(1 << 30))
    return modelfile_server(
        {"long": f"FROM {checkpoint}\n", "pinned": f"FROM {checkpoint}\nPARAMETER num_ctx 6144\n"},
        env={"PYTHONPATH": str(site), "TEST_FREE": str(free_file), "PLUGD_PREFIX_CACHE_BYTES": str(PROMPT_CACHE)})


@pytest.fixture
def client(server):
    client = ollama.Client(host=server.url)
    yield client
    for model in ("long", "pinned"):
        client.generate(model=model, keep_alive=0)


def contexts(server) -> dict[str, int]:
    return {m["name"].removesuffix(":latest"): m["context_length"] for m in httpx.get(f"{server.url}/api/ps").json()["models"]}


def test_the_maximum_when_memory_allows(server, client):
    client.generate(model="long", prompt="Hi", options={"num_predict": 1})
    assert contexts(server) == {"long": MAXIMUM}


def test_lowered_to_what_fits_when_memory_is_short_and_every_dialect_gets_it(server, client, free_file):
    free = 24 << 20
    free_file.write_text(str(free))
    try:
        client.generate(model="long", prompt="Hi", options={"num_predict": 1})
        context = contexts(server)["long"]
        assert 4096 < context < MAXIMUM and context % CACHE_STEP == 0
        assert caches(QWEN3).bytes(context) <= free - PROMPT_CACHE
        # Dialects without num_ctx take a prompt over the old 4,096 default, on the runner already loaded.
        (runner,) = server.runner_pids()
        gpt = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        reply = gpt.chat.completions.create(model="long", messages=[{"role": "user", "content": LONG}], max_tokens=1)
        assert reply.usage.prompt_tokens > 4096
        claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
        message = claude.messages.create(model="long", messages=[{"role": "user", "content": LONG}], max_tokens=1)
        assert message.usage.input_tokens + message.usage.cache_read_input_tokens > 4096  # most of it cached
        responses = gpt.responses.create(model="long", input=LONG, max_output_tokens=16)
        assert responses.usage.input_tokens > 4096
        assert contexts(server) == {"long": context} and server.runner_pids() == [runner]
    finally:
        free_file.write_text(str(1 << 30))


def test_an_explicit_num_ctx_wins(server, client):
    client.generate(model="long", prompt="Hi", options={"num_predict": 1, "num_ctx": 8192})
    assert contexts(server) == {"long": 8192}
    client.generate(model="long", prompt="Hi", options={"num_predict": 1})  # back to the default: reloaded
    assert contexts(server) == {"long": MAXIMUM}
    client.generate(model="pinned", prompt="Hi", options={"num_predict": 1})  # the Modelfile's PARAMETER
    assert contexts(server)["pinned"] == 6144


def test_plugd_context_length_wins(plugd_server_factory, modelfile_server, tmp_path):
    checkpoint = write_checkpoint(tmp_path / "long", "qwen3", overrides={"max_position_embeddings": MAXIMUM})
    live = modelfile_server({"long": f"FROM {checkpoint}\n"}, env={"PLUGD_CONTEXT_LENGTH": "8192"})
    ollama.Client(host=live.url).generate(model="long", prompt="Hi", options={"num_predict": 1})
    assert contexts(live) == {"long": 8192}
